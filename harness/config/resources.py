"""Resource rules: will the run fit the data, the machine and the time, before anything is allocated?

- the corpus splits (sizes only; nothing is read) hold the windows, and the evaluation and fine-tune lengths;
- every DDP rank's slice of pre-tokenized shards holds more than one window;
- a GPU is there when one is asked for, and CPU processes fit the cores;
- memory and time: a CPU run is rehearsed on meta (harness/config/rehearsal.py) against this machine's memory and an
  hour a step; a run for a GPU, checked for a GPU of a named size (``--check --gpu-memory 80GB``), is estimated for
  that GPU instead (harness/config/estimates.py ``gpu_estimate``) and needs no GPU here.
The model is first laid out only by formula (estimates.py ``check_memory``, ``check_gpu``): a model of 2,000 layers
takes seconds to build even on meta, and is refused before that.
"""

from __future__ import annotations

import copy
import importlib.util
import os

import torch
from torch import nn

from harness.config.estimates import (
    PLAIN,
    GpuEstimate,
    NamedGpu,
    SchemeTerms,
    blocks_params,
    check_gpu,
    check_memory,
    gpu_estimate,
)
from harness.config.rehearsal import Evaluation, check_phases, rehearse
from harness.config.spec import DataSettings, RunSpec, TrainerSettings
from harness.data.objectives import Source, Task, Tokenizer
from harness.errors import ConfigError
from harness.model.transformer import Block, Transformer


def check_splits(
    source: Source,
    task: Task,
    tokenizer: Tokenizer,
    data: DataSettings,
    lengths: list[int],
    finetune_length: int | None = None,
) -> int | None:
    """The training split's tokens where they are known before tokenizing (bytes, or shards' ids), checked
    against the windows and lengths asked for; None where they are not."""
    train, val = source.sizes()
    if not tokenizer.byte_level:  # token counts of other tokenizers are unknown until the text is read
        return train if hasattr(source, "check_tokenizer") else None  # shards: their sizes are token counts
    task.check_corpus(train, val, data.seq_len)
    if lengths and task.scores_sequences:
        raise ConfigError(
            f"eval.lengths={lengths} scores text windows; a synthetic task evaluates at "
            "task.eval_lengths instead: drop eval.lengths, or set task.eval_lengths=[...]"
        )
    too_long = [n for n in lengths if n > val]
    if too_long:
        raise ConfigError(
            f"eval.lengths: {too_long} exceed the validation split ({val} tokens), so a window would "
            f"be mostly padding; use lengths up to {val}, or a larger corpus"
        )
    if finetune_length and finetune_length > train:
        raise ConfigError(
            f"eval.finetune_length={finetune_length} exceeds the training split ({train} tokens); "
            f"fine-tune at most {train} tokens, or use a larger corpus"
        )
    return train


def check_rank_slices(source: Source, task: Task, data: DataSettings, trainer: TrainerSettings) -> None:
    """Shards are read one contiguous slice per DDP rank (harness/data/shards.py): every rank's slice must hold
    more than one window, checked here for the world the trainer will start — not in rank 1 after rank 0 started
    (rank 0 was then killed and the run left RUNNING)."""
    if not hasattr(source, "check_tokenizer"):  # text corpora: every rank samples windows from the whole split
        return
    from harness.data.windows import rank_slice

    world = (trainer.processes() or 1) * trainer.num_nodes
    if world < 2:
        return
    train, _ = source.sizes()
    length = task.sequence_tokens(data.seq_len)
    smallest = min(end - start for start, end in (rank_slice(train, r, world) for r in range(world)))
    if smallest <= length:
        raise ConfigError(
            f"each of the {world} DDP ranks (trainer.devices × trainer.num_nodes) reads its own "
            f"{smallest:,} of the shards' {train:,} training tokens, not more than one window of "
            f"{length}; lower data.seq_len, use fewer ranks, or prepare a larger corpus"
        )


def check_device(trainer: TrainerSettings, for_named_gpu: bool = False) -> None:
    """``for_named_gpu``: checked for a GPU of a named size (``--gpu-memory``), which this machine need not have."""
    if trainer.on_gpu and not torch.cuda.is_available() and not for_named_gpu:
        raise ConfigError(
            f"trainer.accelerator={trainer.accelerator} but no CUDA device is visible; use "
            "trainer=cpu, or trainer=ddp trainer.accelerator=cpu for DDP over CPU processes"
        )
    if trainer.accelerator == "tpu" and importlib.util.find_spec("torch_xla") is None:
        raise ConfigError(
            "trainer.accelerator=tpu needs a TPU and torch_xla, which this machine does not have; use "
            "trainer=cpu, or trainer=gpu on a GPU"
        )
    if trainer.accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            "trainer.accelerator=mps needs Apple's Metal GPU, which this machine does not have; use trainer=cpu"
        )
    on_cpu = trainer.accelerator == "cpu" or (trainer.accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and trainer.precision == "16-mixed":  # Lightning swaps it, with a warning; the run would record 16
        raise ConfigError(
            "trainer.precision=16-mixed on the CPU: Lightning trains bf16-mixed instead (the CPU has no float16 "
            "autocast), while the run would record 16-mixed; use trainer.precision=bf16-mixed or 32-true"
        )
    processes, cores = trainer.processes(), os.cpu_count() or 1
    if on_cpu and processes and processes > cores:  # each CPU process computes on its own cores: more would thrash
        raise ConfigError(
            f"trainer.devices={trainer.devices} starts {processes} training processes on this "
            f"machine's {cores} CPU cores; use trainer.devices={cores} at most (more machines: "
            "trainer.num_nodes=N)"
        )


# ---------------------------------------------------------------- memory and time


def meta_model(spec: RunSpec, vocab: int, task: Task, gpu: NamedGpu | None) -> Transformer:
    """The model built on torch's meta device (every constructor check runs, nothing is allocated), after the
    blocks' footprint, a lower bound, has been checked against this machine's memory or the named GPU's (``gpu``:
    a GPU run checked for a GPU of that size)."""
    if gpu:
        check_gpu(
            gpu_estimates(spec, vocab, task.sequence_tokens(spec.data.seq_len), blocks_params(spec.model, vocab)),
            gpu,
            lower_bound=True,
        )
    else:
        check_memory(spec.model, vocab, spec.data.batch_size, task.sequence_tokens(spec.data.seq_len))
    with torch.device("meta"):
        return model_of(spec, vocab, task.sequence_tokens(spec.data.seq_len), task.causal)


def model_of(spec: RunSpec, vocab: int, seq_len: int, causal: bool) -> Transformer:
    """The run's model, on the current default device: meta for the checks, the CPU (after the seed) in build;
    the one construction of a model from a spec, which the benchmarks (harness/bench/internals.py) share.
    ``seq_len``: the positions it is laid out for, a run's ``task.sequence_tokens(spec.data.seq_len)``."""
    return Transformer(spec.model, vocab, seq_len, causal, pos=spec.pos.factory(), attn=spec.attn.factory())


def gpu_estimates(
    spec: RunSpec, vocab: int, length: int, n_params: int, pos: nn.Module | None = None, variant: int = 0
) -> list[GpuEstimate]:
    """The GPU estimates of a training step of ``length`` tokens a sequence (a run's
    ``task.sequence_tokens(spec.data.seq_len)``) and of a fine-tune step, of a model of ``n_params`` parameters
    with the positional scheme ``pos`` (its terms, ``SchemeTerms.of``; None: the blocks alone); ``variant``: the
    bytes a layer of the attention variant keeps beyond softmax's at the training step's tokens. The benchmarks
    (harness/bench/gpu_memory.py, cpu_memory.py) take the training step's, the figure ``--check`` prints."""
    data, tune_length = spec.data, spec.eval.tune_length
    phases = [
        (
            "a training step",
            f"data.batch_size={data.batch_size} or data.seq_len={data.seq_len}",
            data.batch_size,
            length,
        )
    ]
    if tune_length:
        batch, tokens = _finetune_shape(data, tune_length)
        phases.append(
            (f"fine-tuning at eval.finetune_length={tune_length}", f"eval.finetune_length={tune_length}", batch, tokens)
        )
    return [
        gpu_estimate(
            what,
            shrink,
            n_params,
            spec.model,
            vocab,
            b,
            t,
            str(spec.trainer.precision),
            PLAIN if pos is None else SchemeTerms.of(pos),
            variant * b * t // (data.batch_size * length),
        )  # measured at the training step's tokens
        for what, shrink, b, t in phases
    ]


def check_memory_and_time(
    spec: RunSpec, model: Transformer, vocab: int, task: Task, gpu: NamedGpu | None
) -> GpuEstimate | None:
    """A GPU run checked for a named GPU (``gpu``): the estimate of its largest step against it (returned); a CPU
    run: the model rehearsed on meta against this machine's memory (a GPU's kernels, autocast, are not on meta)."""
    data = spec.data
    if gpu:
        variant = variant_bytes_per_layer(spec, model, task)
        return check_gpu(
            gpu_estimates(spec, vocab, task.sequence_tokens(data.seq_len), model.num_params(), model.pos, variant), gpu
        )
    tune = spec.eval.tune_length
    check_phases(
        rehearse(
            model,
            spec.values,
            data.batch_size,
            task.sequence_tokens(data.seq_len),
            evaluations(task, data, spec.eval.lengths),
            _finetune_shape(data, tune) if tune else None,
        )
    )
    return None


def variant_bytes_per_layer(spec: RunSpec, model: Transformer, task: Task) -> int:
    """What one layer of the run's attention variant keeps for a training step beyond softmax in a fused kernel,
    in fp32 bytes: the meta rehearsal's peak of the model (built on meta) cut to 2 layers minus to 1, with its
    variants and with softmax's (what accumulates layer by layer, not what one layer holds for a moment). 0 for
    softmax itself."""
    from attention.softmax import Softmax

    variant = model.variants[0]
    if isinstance(variant, Softmax) and variant.backend != "math":
        return 0
    length = task.sequence_tokens(spec.data.seq_len)
    with torch.device("meta"):
        fused = Softmax(variant.shape)

    def peak(layers: int, attn: Softmax | None = None) -> int:
        cut = copy.deepcopy(model)
        cut.blocks, cut.variants = nn.ModuleList(list(cut.blocks)[:layers]), cut.variants[:layers]
        if attn is not None:
            for block in cut.blocks:
                assert isinstance(block, Block), "the model's blocks are Blocks"
                block.attn.variant = attn
            cut.variants = [attn] * layers
        return rehearse(cut, spec.values, spec.data.batch_size, length, [], None)[0].needs

    return max(0, (peak(2) - peak(1)) - (peak(2, fused) - peak(1, fused)))


def evaluations(task: Task, data: DataSettings, lengths: list[int]) -> list[Evaluation]:
    """Each final evaluation: a synthetic task scores ``task.eval_lengths`` at data.batch_size, task.eval_examples
    examples each; text windows keep the training tokens per batch (harness/model/evaluate.py), counted here as
    one batch (a lower bound of the work)."""
    if task.scores_sequences:
        listed: list[int] = list(getattr(task, "eval_lengths", []))
        batches = -(-int(getattr(task, "eval_examples", 1)) // data.batch_size)
        return [
            Evaluation("task.eval_lengths", n, tokens, data.batch_size, batches)
            for n, tokens in zip(listed, task.evaluation_tokens(lengths), strict=True)
        ]
    return [
        Evaluation("eval.lengths", n, tokens, max(1, data.batch_size * data.seq_len // n), 1)
        for n, tokens in zip(lengths, task.evaluation_tokens(lengths), strict=True)
    ]


def _finetune_shape(data: DataSettings, length: int) -> tuple[int, int]:
    """(batch, length) of a fine-tune step: as many tokens a batch as training (harness/model/extrapolation.py)."""
    return max(1, data.batch_size * data.seq_len // length), length
