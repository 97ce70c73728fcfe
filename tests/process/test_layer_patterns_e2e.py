"""layer_patterns: the tests that run whole commands (the rest: tests/unit/test_layer_patterns.py).

Per-layer patterns (harness/model/layers.py, harness/config/layers.py) and RoPE's rotate_heads.
"""

from __future__ import annotations

import math

import pytest


def test_a_pattern_names_an_option_of_the_users_config_dir(tmp_path):
    """``python run.py --config-dir DIR --check``: Hydra's search path holds the user's folder, so a pattern may name
    an option only it defines. Read from what the command prints: run.py's entry function in this interpreter
    (tests/inprocess.py), which parses ``--config-dir`` as the command line does."""
    from tests import inprocess
    from tests.helpers import HANG, TINY

    (tmp_path / "conf" / "pos").mkdir(parents=True)
    (tmp_path / "conf" / "pos" / "mybias.yaml").write_text("_target_: positional.alibi.ALiBi\n_partial_: true\n")
    argv = ["--config-dir", str(tmp_path / "conf"), "--check", *TINY, f"hydra.run.dir={tmp_path}/run"]
    done = inprocess.run("run", [*argv, "+pos.layers=[rope,mybias]"], str(tmp_path), {}, HANG)
    assert done["code"] == 0 and "ok: pos=rope+mybias " in done["stdout"], done["stderr"][-2000:]


# every attention variant once: local and softmax through an attention pattern, the kernelized ones whole
E2E = [
    ("[local,softmax]", "local+softmax", ["attn=local", "attn.window=8"]),
    (None, "linear", ["attn=linear"]),
    (None, "performer", ["attn=performer"]),
]


@pytest.mark.parametrize("attn_layers,attn,overrides", E2E, ids=[a for _, a, _ in E2E])
def test_a_pattern_trains_end_to_end_into_mlflow(train_tiny_shared, attn_layers, attn, overrides):
    layers = [f"+attn.layers={attn_layers}"] if attn_layers else []
    summary, client = train_tiny_shared(
        "pos=rope",
        "+pos.layers=[rope,none]",
        *overrides,
        *layers,
        "task=clm",
        "trainer.max_steps=8",
        "trainer.val_check_interval=4",
    )
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED" and summary.step == 8
    assert run.data.tags["pos"] == "rope+none" and run.data.tags["attn"] == attn
    loss = [m.value for m in client.get_metric_history(summary.run_id, "val/loss")]
    assert len(loss) == 2 and all(math.isfinite(v) for v in loss)
