"""modern_block: the tests that train end to end (the rest: tests/unit/test_modern_block.py).

The modern block (model=modern: RMSNorm, SwiGLU, no biases, untied head, QK-norm) and the length-scaled
attention temperature (model.temperature): parity with transformers' Llama, Qwen3 and Llama 4 in fp64, the
formulas by hand, and a run of each read back from MLflow.
"""

from __future__ import annotations

import json
import math


def test_the_modern_block_with_qk_norm_and_ssmax_trains_into_mlflow(train_tiny):
    summary, client = train_tiny(
        "model=modern",
        "model.qk_norm=true",
        "model.temperature=ssmax",
        "pos.layout=half",
        "task=clm",
        "trainer.max_steps=12",
        "trainer.val_check_interval=6",
    )
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (
        params["model.mlp"],
        params["model.norm_type"],
        params["model.head"],
        params["model.qk_norm"],
        params["model.temperature"],
        params["pos.layout"],
    ) == ("swiglu", "rmsnorm", "untied", "True", "ssmax", "half")
    loss = client.get_metric_history(summary.run_id, "val/loss")
    assert loss and all(math.isfinite(m.value) for m in loss) and loss[-1].value < math.log(258)
    written = json.loads(open(client.download_artifacts(summary.run_id, "rope_parameters.json")).read())
    assert written == {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "layer_types": ["full_attention"] * 2,
    }  # transformers' form of the trained RoPE
