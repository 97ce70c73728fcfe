"""The whole pos × attn grid, end to end: each cell trains 2 steps or is refused with its reason.

Parametrised over conf/pos/*.yaml × conf/attn/*.yaml, so a new option joins the grid by existing.
"""

import math
import re

import pytest

from harness.config.catalog import option_classes
from harness.config.compat import compatibility
from harness.errors import ConfigError


@pytest.mark.parametrize("cell", compatibility(), ids=lambda c: f"{c.pos}-{c.attn}")
def test_cell_trains_or_is_refused(train_tiny_shared, cell):
    causal_only = option_classes("pos")[cell.pos].bidirectional_refusal is not None  # FoX refuses task=mlm
    overrides = (
        f"pos={cell.pos}",
        f"attn={cell.attn}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        *(["task=clm"] if causal_only else []),
    )
    if not cell.allowed:
        with pytest.raises(ConfigError, match=re.escape(cell.refusal)):
            train_tiny_shared(*overrides)
        return
    summary, client = train_tiny_shared(*overrides)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["pos"] == cell.pos and run.data.tags["attn"] == cell.attn
    assert summary.step == 2 and math.isfinite(summary.val_loss)


@pytest.mark.parametrize("attn", ["local", "linear", "performer"])
def test_causal_lm_trains_with_each_efficient_variant(train_tiny_shared, attn):
    summary, client = train_tiny_shared(
        "pos=rope", f"attn={attn}", "task=clm", "trainer.max_steps=2", "trainer.val_check_interval=2"
    )
    assert client.get_run(summary.run_id).info.status == "FINISHED" and math.isfinite(summary.val_loss)
