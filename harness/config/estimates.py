"""What a run costs, by formula: will it fit (a first gate, before the model is even laid out on the meta device),
and its budget.

A lower bound on purpose (a refusal must never stop a run that would have fitted): the transformer
blocks' fp32 weights, gradients and AdamW's two moments (16 bytes a parameter), the activations
autograd keeps per layer for the tokens of one step (input, q, k, v, attention output, the two
residual branches and the MLP's hidden and GELU: about 10·C + 2·F floats per token, Korthikanti et
al. 2022 §4.1 without the attention matrix), and the logits with their gradient (2·V floats per
token). A model of 2,000 layers takes seconds to lay out even on meta; this refuses it at once.
What a scheme or a variant makes large is measured after, by rehearsing the run (rehearsal.py).

A run for a GPU is estimated for a GPU of a named size instead (``python run.py --check --gpu-memory 80GB``,
80 GB by default; ``GpuEstimate``): the weights, their gradients and AdamW's two moments at the precision
``trainer.precision`` keeps them in, and the activations a training step keeps for its backward at the
width autocast gives them. A CPU cannot rehearse this (autocast does not reach torch's meta tensors), so it
is a formula, written term by term below.

The budget, said by ``--check`` before a run is paid for, and the two limits a run is held to (``budget_of``):

- **Tokens and epochs**: max_steps × the global batch (data.batch_size × data.seq_len × devices × nodes ×
  trainer.accumulate_grad_batches) tokens, against the training split: more than ``budget.max_epochs`` passes
  (100 by default) is refused — a paper-scale run on the 2 MB embedded corpus would read it ~1,800 times and
  measure memorisation, not the scheme. Counted where token counts are known before tokenizing (bytes, shards);
  synthetic tasks draw fresh examples and have no epochs.
- **FLOPs and GPU-hours**: 6·N + 6·L·T·C FLOPs a token (Kaplan et al. 2020, Table 1: forward 2·N + 2·n_layer·
  n_ctx·d_attn, backward twice that; N the blocks' and the output layer's weights), and for a GPU run the hours
  at ``budget.gpu_tflops`` × ``budget.mfu`` (989 TFLOP/s, an H100 SXM's dense bf16 peak, at 40 %) — an
  estimate, said as one.
- **The paper's setting**: a ``scale=paper`` file states the paper's model and data (``paper:`` — its source,
  parameters, tokens a step, vocabulary); a run whose vocabulary differs is refused unless the user drops the
  node on purpose (``~paper``), and ``--check`` prints the run's parameters and batch beside the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.allocator import available_bytes
from harness.errors import ConfigError

FLOAT = 4  # bytes; the CPU trains in fp32


def blocks_params(model, vocab: int) -> int:
    """The parameters of the transformer blocks and embeddings alone: per layer 4·C² + m·C·F weights (attention,
    MLP: m = 2 for GELU, 3 for SwiGLU), plus V·C embeddings."""
    c = model.d_model
    return model.n_layers * (4 * c * c + model.mlp_matrices * c * model.d_ff) + vocab * c


def check_memory(model, vocab: int, batch: int, seq_len: int) -> None:
    """Refuse a CPU run whose lower-bound footprint (the module docstring's terms) exceeds this machine's available
    memory, naming the keys that can make it fit, by what is too large: the parameters alone (then no batch fits:
    the vocabulary's embeddings or the layers, whichever holds more), else the tokens a step (their logits when the
    vocabulary makes most of them)."""
    free = available_bytes()
    if free is None:
        return
    c, tokens, n_params = model.d_model, batch * seq_len, blocks_params(model, vocab)
    logit_tokens = min(tokens, model.loss_chunk or tokens)  # model.loss_chunk: the tokens whose logits exist at once
    weights, logits = 16 * n_params, FLOAT * 2 * logit_tokens * vocab
    activations = FLOAT * model.n_layers * tokens * (10 * c + 2 * model.d_ff)
    need = weights + activations + logits
    if need <= free:
        return
    if weights > free and vocab * c > n_params - vocab * c:
        fix = (
            f"the parameters alone do not fit, mostly the embeddings: lower tokenizer.vocab_size={vocab} or "
            f"model.d_model={c}"
        )
    elif weights > free:
        fix = (
            f"the parameters alone do not fit, whatever the batch: lower model.n_layers={model.n_layers}, "
            f"model.d_model={c} or model.d_ff={model.d_ff}"
        )
    elif logits > activations:
        fix = (
            f"the logits hold most of a step: lower tokenizer.vocab_size={vocab}, data.batch_size={batch} or "
            f"data.seq_len={seq_len}{_chunk_fix('them', free - (need - logits), logits, logit_tokens)}"
        )
    else:
        fix = f"lower data.batch_size={batch} or data.seq_len={seq_len}"
    raise ConfigError(
        f"training needs at least {gib(need)} ({gib(weights)} for {n_params:,} parameters with "
        f"their gradients and AdamW's moments, {gib(need - weights)} for {batch}×{seq_len} tokens "
        f"a step) but {gib(free)} is available; {fix}"
    )


def _chunk_fix(what: str, room: int, logits: int, logit_tokens: int) -> str:
    """``, or make <what> N tokens at a time with model.loss_chunk=N``: N the largest power of two of tokens whose
    logits fit ``room`` bytes (``logits`` bytes hold ``logit_tokens`` tokens' now); "" unless N is fewer tokens."""
    per_token = logits // logit_tokens
    chunk = 2 ** (room // per_token).bit_length() // 2 if room >= per_token else 0
    return (
        f", or make {what} {chunk} tokens at a time with model.loss_chunk={chunk} (the same loss)"
        if 0 < chunk < logit_tokens
        else ""
    )


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


# ---------------------------------------------------------------- a GPU of a named size

DEFAULT_GPU_MEMORY = "80GB"  # an A100 / H100 80 GB
_UNITS = {"GB": 10**9, "GIB": 2**30, "MB": 10**6, "MIB": 2**20, "TB": 10**12, "TIB": 2**40}


MAX_GPU_BYTES = 10**15  # a petabyte: far above any accelerator's memory, far below float overflow


@dataclass(frozen=True)
class NamedGpu:
    """The GPU a check is for: its size as the user wrote it, and in bytes."""

    named: str
    memory: int

    @classmethod
    def parse(cls, text: str) -> NamedGpu:
        """'80GB' (10⁹ bytes a GB, as GPU sizes are sold: a conservative reading of '80 GB'), '80GiB' (2³⁰),
        MB/MiB, TB/TiB; the unit is required."""
        number = text.strip().rstrip("BbIi").rstrip("GgMmTt")
        unit = text.strip()[len(number) :].upper()
        try:
            value = float(number)
        except ValueError:
            value = float("nan")
        if unit not in _UNITS or not value > 0 or value == float("inf"):
            raise ConfigError(
                f"--gpu-memory={text!r} is not a memory size; give a number and a unit, e.g. --gpu-memory 80GB "
                "(or 80GiB, 40GB, 24GiB)"
            )
        if value * _UNITS[unit] > MAX_GPU_BYTES:
            raise ConfigError(
                f"--gpu-memory={text!r} is larger than any GPU (at most {MAX_GPU_BYTES // 10**12:,} TB here); "
                "give the GPU's size, e.g. --gpu-memory 80GB"
            )
        return cls(text.strip(), int(value * _UNITS[unit]))


@dataclass(frozen=True)
class Precision:
    """Bytes a parameter (``state``: its weight, its gradient and each AdamW moment, all kept in the weights'
    dtype; ``cast``: autocast's low-precision copy for the matrix products) and bytes an activation value:
    ``activation`` for what the matrix products and GELU return, ``residual`` for the residual stream and what
    LayerNorm keeps (autocast runs LayerNorm in fp32)."""

    state: int
    cast: int
    activation: int
    residual: int


_FP32 = Precision(4, 0, 4, 4)
_MIXED = Precision(4, 2, 2, 4)  # fp32 weights and optimizer, bf16/fp16 autocast
_HALF = Precision(2, 0, 2, 2)  # the whole model converted (bf16-true, 16-true)
_FP64 = Precision(8, 0, 8, 8)
PRECISIONS: dict[str, Precision] = {
    "32-true": _FP32,
    "32": _FP32,
    "16-mixed": _MIXED,
    "16": _MIXED,
    "bf16-mixed": _MIXED,
    "bf16": _MIXED,
    "transformer-engine": _MIXED,
    "transformer-engine-float16": _MIXED,
    "16-true": _HALF,
    "bf16-true": _HALF,
    "64-true": _FP64,
    "64": _FP64,
}


@dataclass(frozen=True)
class GpuEstimate:
    """One training step's memory on a GPU, in bytes, by term."""

    what: str  # "a training step", "fine-tuning at eval.finetune_length=2048"
    tokens: tuple[int, int]  # (batch, length)
    shrink: str  # the keys that shrink the tokens' part: "data.batch_size=32 or data.seq_len=512"
    states: int  # weights, gradients, AdamW's moments, autocast's weight copies
    activations: int  # kept by the blocks and the head for the backward
    logits: int  # the logits, their fp32 copy, cross-entropy's log-softmax and its gradient
    loss_chunk: int | None = None  # model.loss_chunk: the logits are one chunk's, not the whole step's

    @property
    def total(self) -> int:
        return self.states + self.activations + self.logits

    def summary(self) -> str:
        b, t = self.tokens
        chunked = f" ({min(self.loss_chunk, b * t)} at a time)" if self.loss_chunk else ""
        return (
            f"{gib(self.total)} ({gib(self.states)} weights, gradients and AdamW state, {gib(self.activations)} "
            f"activations and {gib(self.logits)} logits for {b}×{t} tokens{chunked})"
        )


@dataclass(frozen=True)
class SchemeTerms:
    """What the positional scheme adds to a step (from its declarations): whether it rotates q and k, and its
    logit bias: none, fixed (ALiBi's slopes) or learned (T5's table), shared by the layers or one per layer."""

    rotary: bool = False
    bias: str | None = None  # None | "fixed" | "learned"
    bias_per_layer: bool = False

    @classmethod
    def of(cls, scheme) -> SchemeTerms:
        hooks = type(scheme).hooks()
        bias = None
        if "logit_bias" in hooks:
            bias = "learned" if any(p.requires_grad for p in scheme.parameters()) else "fixed"
        return cls("rotary" in hooks, bias, bool(getattr(scheme, "bias_depends_on_layer", True)))


PLAIN = SchemeTerms()  # no rotation, no bias: the blocks alone


def gpu_estimate(
    what: str,
    shrink: str,
    n_params: int,
    model,
    vocab: int,
    batch: int,
    length: int,
    precision: str,
    scheme: SchemeTerms = PLAIN,
    variant_fp32: int = 0,
) -> GpuEstimate:
    """The memory of one training step of ``model`` (a ModelConfig: C = d_model, F = d_ff, H = n_heads, L =
    n_layers) with ``n_params`` parameters on ``batch`` × ``length`` tokens at ``precision``, attention in a fused
    kernel (torch's SDPA takes one on a GPU: it keeps a log-sum-exp per head, not the T×T weights).

    Per parameter: weight + gradient + AdamW's two moments + autocast's copy (16 + 2 bytes in bf16-mixed).
    Per token: what the blocks and the head keep for backward (``_token_bytes``) and the logits (``_logit_bytes``);
    per step, a logit bias's tables and masks (``_bias_bytes``). Attention is counted as softmax's fused kernel
    keeps it; another variant (Performer's random features, linear attention's prefix sums) adds ``variant_fp32``,
    the bytes a layer of it keeps beyond softmax's in fp32 (measured on meta tensors: ``variant_bytes_per_layer``),
    at a/4 of that. A scheme's own intermediates (FIRE's MLP over every pair of positions) are not in the formula.
    """
    p = PRECISIONS[str(precision)]  # every trainer.precision the spec takes (harness/config/spec.py) has one
    tokens = batch * length
    states = n_params * (4 * p.state + p.cast)
    variant = model.n_layers * variant_fp32 * p.activation // 4
    activations = tokens * _token_bytes(model, p, scheme) + _bias_bytes(model, p, scheme, batch, length) + variant
    logit_tokens = min(tokens, model.loss_chunk or tokens)  # model.loss_chunk: one chunk's (harness/model/loss.py)
    return GpuEstimate(
        what, (batch, length), shrink, states, activations, logit_tokens * _logit_bytes(vocab, p), model.loss_chunk
    )


def _token_bytes(model, p: Precision, scheme: SchemeTerms) -> int:
    """Bytes a token keeps for backward in the blocks and the head. Per layer (Korthikanti et al. 2022, §4.1,
    without the T×T terms), with a = activation bytes and r = residual bytes (``Precision``):
      2·r·C    the inputs of the two norms (the residual stream); RMSNorm keeps its normalised input too, in fp32
               under autocast (torch's RMSNorm is x·rsqrt(mean x²)·w, two products): 4·r·C
      2·a·C    the two norms' outputs as the projections take them
      3·a·C    q, k, v (one projection's output, kept whole while v is)
      2·a·C    q and k rotated, if the scheme rotates them (rotary hook)
      2·a·C    the attention output and its (B, T, C) copy for the output projection
      2·a·F    the MLP's hidden layer before and after GELU (SwiGLU: 4·a·F, the gate and up projection, the gate's
               SiLU and the product the down projection takes)
      4·H      the fused kernel's log-sum-exp (fp32)
      2·C      the two dropout masks (one byte a value), if model.dropout > 0
    The head: BERT's (model.head=bert), 2·r·C (its two norms' inputs) + 3·a·C (the dense layer's input, GELU's
    input, the decoder's); a final norm and the decoder (tied, untied), r·C + a·C; RMSNorm's r·C more a norm."""
    c, f, a, r = model.d_model, model.d_ff, p.activation, p.residual
    norm = 2 * r * c if model.norm_type == "rmsnorm" else r * c  # one norm's kept inputs
    rotated = 2 * c if scheme.rotary else 0
    dropout = 2 * c if model.dropout else 0
    mlp = 4 * f if model.mlp == "swiglu" else 2 * f
    per_layer = 2 * norm + a * (7 * c + rotated + mlp) + 4 * model.n_heads + dropout
    final_norm = norm if model.norm == "pre" else 0
    head = 2 * norm + 3 * a * c if model.head == "bert" else final_norm + a * c
    return model.n_layers * per_layer + head


def _logit_bytes(vocab: int, p: Precision) -> int:
    """V·(a + 4 + 4 + 4) a token: the logits as the decoder returns them, their fp32 copy (none when a = 4:
    ``.float()`` then returns the same tensor), the fp32 log-softmax cross-entropy keeps, and the fp32 gradient
    backward writes into it while all of these are still held (results/bench_gpu/ holds the estimate against an
    H200's measured peaks)."""
    a = p.activation
    return vocab * (a + (4 if a != 4 else 0) + 4 + 4)


def _bias_bytes(model, p: Precision, scheme: SchemeTerms, batch: int, length: int) -> int:
    """A logit bias, per step: its dense (1, H, T, T) table in fp32 (4·H·T², once, or once per layer if each
    layer has its own), the additive mask each layer hands the kernel (a·H·T² a layer), and for a learned bias
    the gradient the kernel writes for every batch row (a·B·H·T², one layer at a time)."""
    if not scheme.bias:
        return 0
    pairs, n, a = model.n_heads * length * length, model.n_layers, p.activation
    bias = 4 * pairs * (n if scheme.bias_per_layer else 1) + a * pairs * n
    return bias + (a * batch * pairs if scheme.bias == "learned" else 0)


def check_gpu(estimates: list[GpuEstimate], gpu: NamedGpu, lower_bound: bool = False) -> GpuEstimate:
    """The largest estimate, refused if it exceeds the GPU's memory (``lower_bound``: estimated from the blocks'
    parameters alone, before the model is built)."""
    worst = max(estimates, key=lambda e: e.total)
    if worst.total > gpu.memory:
        fix = (
            f"lower {worst.shrink}"
            if worst.activations + worst.logits > worst.states
            else "lower model.d_model, model.n_layers or model.d_ff"
        )
        b, t = worst.tokens
        if worst.logits > worst.activations:
            room, logit_tokens = gpu.memory - (worst.total - worst.logits), min(b * t, worst.loss_chunk or b * t)
            fix += _chunk_fix("the logits", room, worst.logits, logit_tokens)
        needs = "at least" if lower_bound else "about"
        raise ConfigError(
            f"on a GPU of {gpu.named} ({gib(gpu.memory)}) {worst.what} does not fit: it needs {needs} "
            f"{worst.summary()}; {fix}, or name a larger GPU with --gpu-memory"
        )
    return worst


# ---------------------------------------------------------------- the budget: tokens, FLOPs, GPU-hours, the paper


@dataclass(frozen=True)
class Budget:
    tokens: int  # trained, over the whole run
    train_tokens: int | None  # the training split, where known before tokenizing
    flops: float
    gpu_hours: float | None  # a GPU run, at the stated peak and MFU
    paper: str = ""  # the run beside the paper's setting, where the preset states one

    @property
    def epochs(self) -> float | None:
        return self.tokens / self.train_tokens if self.train_tokens else None

    def line(self) -> str:
        """`` · 1.6B tokens (12.3 epochs) · 2.1e18 FLOPs ≈ 1.5 GPU-hours at 40 % of 989 TFLOP/s``."""
        epochs = f" ({self.epochs:,.1f} epochs)" if self.epochs is not None else ""
        hours = f" ≈ {self.gpu_hours:,.1f} GPU-hours" if self.gpu_hours is not None else ""
        return f" · {_short_count(self.tokens)} tokens{epochs} · {self.flops:.1e} FLOPs{hours}{self.paper}"


def _short_count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.1f}{unit}"
    return f"{n:,.0f}"


def budget_of(
    settings, trainer, data, task, model, vocab: int, n_params: int, train_tokens: int | None, paper: dict | None
) -> Budget:
    """The run's budget; refused past ``settings.max_epochs`` or off the paper's vocabulary (the module docstring's
    budget)."""
    length = task.sequence_tokens(data.seq_len)
    world = (trainer.processes() or 1) * trainer.num_nodes
    step = data.batch_size * length * world * trainer.accumulate_grad_batches
    tokens = trainer.max_steps * step
    n = blocks_params(model, vocab)  # N = L·(4·C² + m·C·F) + C·V (the module docstring's budget)
    flops = tokens * (6 * n + 6 * model.n_layers * length * model.d_model)
    hours = flops / (settings.gpu_tflops * 1e12 * settings.mfu) / 3600 if trainer.on_gpu else None
    known = None if task.scores_sequences else train_tokens
    found = Budget(tokens, known, flops, hours, _beside_paper(paper, vocab, n_params, step))
    if settings.max_epochs is not None and found.epochs is not None and found.epochs > settings.max_epochs:
        raise ConfigError(
            f"{trainer.max_steps:,} steps of {step:,} tokens read the training split ({known:,} tokens) "
            f"{found.epochs:,.0f} times, beyond budget.max_epochs={settings.max_epochs:g}: the run "
            "would measure memorisation; give a larger corpus (data=...), fewer trainer.max_steps, or "
            "budget.max_epochs=null to train it anyway"
        )
    return found


def _beside_paper(paper: dict | None, vocab: int, n_params: int, step: int) -> str:
    if not paper:
        return ""
    if paper.get("vocab_size") and int(paper["vocab_size"]) != vocab:
        raise ConfigError(
            f"this scale=paper setting is the paper's model on {paper.get('data', 'its data')} with "
            f"{paper.get('tokenizer', 'its tokenizer')} ({int(paper['vocab_size']):,} tokens); this "
            f"tokenizer's {vocab:,} make it {n_params / 1e6:.1f}M parameters instead: give the paper's "
            "data and tokenizer (README, 'The same presets at scale=paper'), or ~paper to train this "
            "substitute on purpose"
        )
    said = []
    if paper.get("params"):
        said.append(f"{n_params / 1e6:.1f}M parameters vs the paper's {int(paper['params']) / 1e6:.0f}M")
    if paper.get("batch_tokens"):
        said.append(f"{step:,} tokens a step vs the paper's {int(paper['batch_tokens']):,}")
    return f" · paper ({paper.get('source', 'the preset')}): {', '.join(said)}" if said else ""
