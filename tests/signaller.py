"""``python tests/signaller.py SIGNAL PHASE TIMEFILE run.py-args…``: run.py, which sends itself SIGNAL (TERM or
INT) in PHASE — ``fit`` (before optimizer step 3), ``evaluation`` (as the final evaluation starts) or
``report`` (as a sweep's report starts, its cells done) — and writes the time it did to TIMEFILE, so a test
knows the signal was sent (and ``fit`` sends it once). A test that runs run.py's entry in its own process
(tests/inprocess.py) arms the same stop with ``arm``.
"""

import os
import runpy
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import harness.train as train  # noqa: E402
from harness.model.module import LanguageModel  # noqa: E402


def arm(number: int, phase: str, timefile: Path, patch: Callable[[object, str, object], None] = setattr) -> None:
    """This process sends itself signal ``number`` in ``phase``; ``patch(owner, name, value)`` puts the hook in
    (a test passes its monkeypatch's setattr, which takes it out again)."""

    def send() -> None:
        timefile.write_text(repr(time.time()))
        os.kill(os.getpid(), number)

    if phase == "fit":
        original_step = LanguageModel.training_step

        def training_step(self, batch, batch_idx):
            if self.global_step == 3 and not timefile.exists():
                send()
            return original_step(self, batch, batch_idx)

        patch(LanguageModel, "training_step", training_step)
    elif phase == "report":
        from harness.sweep.callback import MlflowSweep

        original_finish = MlflowSweep._finish

        def finish(self, *args):
            send()
            time.sleep(0.5)
            return original_finish(self, *args)

        patch(MlflowSweep, "_finish", finish)
    else:
        original_evaluate = train.evaluate

        def evaluate(*args, **kwargs):
            send()
            time.sleep(0.5)  # the signal is handled here, in Python code outside Lightning's loops
            return original_evaluate(*args, **kwargs)

        patch(train, "evaluate", evaluate)


if __name__ == "__main__":
    arm(getattr(signal, f"SIG{sys.argv[1]}"), sys.argv[2], Path(sys.argv[3]))
    sys.argv = [str(ROOT / "run.py"), *sys.argv[4:]]
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
