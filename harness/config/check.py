"""``check(spec) -> Checked``: every rule that can run before anything is trained or logged, cheapest first.

``load`` has typed and range-checked every value (harness/config/values.py); here the rest, in order:
1. the tracking store (parsed, whole, an sqlite file or creatable, a server that answers) and the folders a run
   writes;
2. the cheap objects built for real: tokenizer, task, data source (nothing read), and the optimizer over one
   scalar, so their own constructors' checks run;
3. the model built on torch's ``meta`` device (harness/config/resources.py ``meta_model``): every constructor check
   (head dims, windows, the pos × attn pairing of every layer), the exact parameter count, nothing allocated;
4. the pairings across the spec (harness/config/pairings.py): packed documents, phases, export, evaluation scalings;
5. the resources (harness/config/resources.py): the corpus splits, the DDP slices, the device, the budget, memory
   and time.
Each refusal is a one-line ``ConfigError`` naming the key and the fix. Nothing here imports Lightning or MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.config import pairings, resources
from harness.config.estimates import Budget, GpuEstimate, NamedGpu, budget_of
from harness.config.spec import RunSpec
from harness.data.objectives import Source, Task, Tokenizer
from harness.errors import ConfigError, one_line
from harness.integrity import check_writable_dir
from harness.record.preflight import store_to_write

if TYPE_CHECKING:  # harness.model.phases imports Lightning (seconds), which a refusal must not pay for
    from harness.model.phases import Phase


@dataclass(frozen=True)
class Checked:
    """A spec that passed every check, with the cheap objects made for it (built once, used by the run)."""

    spec: RunSpec
    uri: str  # the tracking store
    tokenizer: Tokenizer
    task: Task
    source: Source  # the corpus source, not read
    n_params: int
    budget: Budget  # tokens, epochs, FLOPs and GPU-hours (harness/config/estimates.py)
    phases: tuple[Phase, ...] = ()  # the run's positional phases (harness/model/phases.py)
    documents: bool = False  # the text windows carry document_ids (``pairings.check_documents``)
    gpu: GpuEstimate | None = None  # a GPU run checked for a named GPU: its largest step's estimate


def check(spec: RunSpec, gpu: NamedGpu | None = None) -> Checked:
    """``gpu``: check a GPU run for a GPU of that size (``--check --gpu-memory``) rather than for this machine."""
    uri = store_to_write(spec.logger.tracking_uri)
    if spec.checkpoint.dir:
        check_writable_dir(
            Path(spec.checkpoint.dir).expanduser().absolute(),
            "checkpoint.dir",
            "set checkpoint.dir to a directory you can write",
        )
    tokenizer: Tokenizer = spec.tokenizer.build()
    task: Task = spec.task.build(tokenizer=tokenizer)
    source: Source = spec.source.build()
    pairings.check_source_reads(spec.data, source, spec.choices.data)
    pairings.check_token_source(source, tokenizer, task, spec.choices)
    _check_optimizer(spec)
    if spec.run.diagnostics:
        pairings.check_diagnosable(spec.attn)
    for_gpu = gpu if spec.trainer.on_gpu else None  # a GPU run is estimated for the named GPU, a CPU run rehearsed
    model = resources.meta_model(spec, tokenizer.vocab_size, task, for_gpu)
    documents = pairings.check_documents(spec.model, source, tokenizer, task, spec.choices.data)
    phases = pairings.checked_phases(spec, model, task)
    if spec.run.export == "hf":
        pairings.check_exportable(pairings.final_model(phases, model), task, phases)
    pairings.check_extrapolation(spec.eval, task, pairings.final_model(phases, model), spec.choices.task)
    train_tokens = resources.check_splits(source, task, tokenizer, spec.data, spec.eval.lengths, spec.eval.tune_length)
    resources.check_rank_slices(source, task, spec.data, spec.trainer)
    budget = budget_of(
        spec.budget,
        spec.trainer,
        spec.data,
        task,
        spec.model,
        tokenizer.vocab_size,
        model.num_params(),
        train_tokens,
        spec.run.paper,
    )
    resources.check_device(spec.trainer, for_named_gpu=gpu is not None)
    estimate = (
        resources.check_memory_and_time(spec, model, tokenizer.vocab_size, task, for_gpu)
        if for_gpu or not spec.trainer.on_gpu
        else None
    )
    return Checked(spec, uri, tokenizer, task, source, model.num_params(), budget, phases, documents, estimate)


def _check_optimizer(spec: RunSpec) -> None:
    """The optimizer over one scalar: torch's own argument checks run before the Trainer exists."""
    import torch

    spec.schedule.build()
    try:
        spec.optimizer.build([torch.zeros(1, requires_grad=True)])
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # torch's own argument checks
        raise ConfigError(f"optim.optimizer: {one_line(e)}; fix that value of optim.optimizer") from None
