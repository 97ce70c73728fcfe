"""Room: building. From overrides to a checked config and the objects it describes.

Owns: composing the Hydra config outside run.py (``compose``), the typed schema of every node (``schema``),
the one validation pass that runs before anything is built or logged (``validate``), building the model, data
and trainer from a checked config (``build``), the pos × attn compatibility matrix (``compat``), the per-layer
patterns pos.layers / attn.layers (``layers``), and a cell's tuned values from a best.json (``tuned``,
``optim.tuned``). Also the config resolvers (``${precision_for:...}``), registered when this package is
imported, before any config is resolved.

May import: harness.data, harness.model, harness.record (its store checks), harness.scaleout, harness.pretrained
(whether a model has transformers' form), positional, attention, and the ground.
"""

from __future__ import annotations


def precision_for(accelerator: str) -> str:
    """``${precision_for:${.accelerator}}`` in conf/trainer/ddp.yaml: bf16 autocast where it pays
    (GPUs), full fp32 on the CPU, where bf16 autocast is slow and would change the numbers of a
    run meant to match a single-process one."""
    return "32-true" if str(accelerator) == "cpu" else "bf16-mixed"


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("precision_for"):
        OmegaConf.register_new_resolver("precision_for", precision_for)


register_resolvers()
