"""``python tests/killer.py STEP run.py-args…``: run.py, SIGKILLed before optimizer step STEP+1.

Just before dying it flushes the MLflow logger, as its size/time trigger may do at any moment,
so the store holds points past the last committed checkpoint: the resume must not repeat them.
Only the training steps of runs whose pos option is ``$KILL_POS`` (default: every run) die.
"""

import os
import runpy
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.model.module import LanguageModel  # noqa: E402

kill_at, only_pos = int(sys.argv[1]), os.environ.get("KILL_POS")
original_step = LanguageModel.training_step


def training_step(self, batch, batch_idx):
    scheme = type(self.model.pos).__module__.rsplit(".", 1)[-1]
    if self.global_step == kill_at and only_pos in (None, scheme):
        self.trainer.logger.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return original_step(self, batch, batch_idx)


LanguageModel.training_step = training_step
sys.argv = [str(ROOT / "run.py"), *sys.argv[2:]]
runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
