"""Room: the edge. From a command line's overrides to a checked run and the objects it trains with:
``load`` → ``RunSpec`` → ``check`` → ``build``.

Owns: reading Hydra's config, the one place that does (``load``: compose, a sweep's cells, the job's spec, a cell's
tuned values from a best.json for ``optim.tuned``), the typed run (``spec``: settings dataclasses, components,
``RunSpec``), the values rules that type a resolved config into it, down to an option named by entry,
``rope(base=1e6)`` in ``pos.layers`` or ``phases`` (``values``), the checks (``check``: in order, with the pairing
rules in ``pairings`` and the resource rules in ``resources``, the memory rehearsal on meta in ``rehearsal``, the GPU
estimate and the budget by formula in ``estimates``), the one construction (``build``), the option catalogue and
where a key lives (``catalog``, ``--list``), the pos × attn matrix (``compat``, ``--matrix``) and Hydra's exceptions
as one line (``hydra_errors``). Also the config resolvers (``${precision_for:...}``), registered when this package
is imported, before any config is resolved.

May import: harness.data, harness.model, harness.record (its store checks), harness.scaleout, harness.pretrained
(whether a model has transformers' form), positional, attention, and the ground.
"""

from __future__ import annotations

from omegaconf import OmegaConf


def precision_for(accelerator: str) -> str:
    """``${precision_for:${.accelerator}}`` in conf/trainer/ddp.yaml: bf16 autocast where it pays
    (GPUs), full fp32 on the CPU, where bf16 autocast is slow and would change the numbers of a
    run meant to match a single-process one."""
    return "32-true" if str(accelerator) == "cpu" else "bf16-mixed"


OmegaConf.register_new_resolver("precision_for", precision_for, replace=True)  # a re-import registers the same one
