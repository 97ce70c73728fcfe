"""Will it fit? Memory a run needs, against memory this machine has — decided before anything is built.

The estimate is a *lower bound* on purpose (a refusal must never stop a run that would have fitted):
fp32 weights, gradients and AdamW's two moments (16 bytes a parameter), the activations autograd
keeps per layer for the tokens of one step (input, q, k, v, attention output, the two residual
branches and the MLP's hidden and GELU: about 10·C + 2·F floats per token, Korthikanti et al. 2022
§4.1 without the attention matrix), and the logits with their gradient (2·V floats per token). A
variant that materialises the T×T logits (``needs_dense_logits``) adds B·H·T² floats per layer.
Evaluation at length L keeps no activations but scores the same tokens per batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import ConfigError

FLOAT = 4  # bytes; the CPU trains in fp32


@dataclass(frozen=True)
class Footprint:
    n_params: int
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    vocab: int
    dense_logits: bool  # the attention forms B·H·T·T logits (a content bias, the math backend)

    @classmethod
    def of_blocks(cls, model, vocab: int) -> Footprint:
        """The transformer blocks and embeddings alone (a lower bound before the scheme's parameters):
        per layer 4·C² + 2·C·F weights (attention, MLP), plus V·C embeddings."""
        c, f = model.d_model, model.d_ff
        params = model.n_layers * (4 * c * c + 2 * c * f) + vocab * c
        return cls(params, c, f, model.n_layers, model.n_heads, vocab, dense_logits=False)

    def training_bytes(self, batch: int, length: int) -> int:
        tokens = batch * length
        per_layer = tokens * (10 * self.d_model + 2 * self.d_ff)
        attention = batch * self.n_heads * length * length if self.dense_logits else 0
        activations = self.n_layers * (per_layer + attention) + 2 * tokens * self.vocab
        return 16 * self.n_params + FLOAT * activations

    def eval_bytes(self, batch: int, length: int) -> int:
        tokens = batch * length
        attention = batch * self.n_heads * length * length if self.dense_logits else 0
        return 4 * self.n_params + FLOAT * (tokens * (2 * self.d_model + self.vocab) + attention)


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping); None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(fp: Footprint, batch: int, seq_len: int, eval_lengths: list[int], on_gpu: bool,
                 finetune_length: int | None = None) -> None:
    """Refuse a run whose lower-bound footprint exceeds this machine's available memory (CPU runs). A fine-tune
    before evaluation (eval.finetune_steps) trains at ``finetune_length`` with as many tokens per batch as
    training (harness/model/extrapolation.py): attention's T² terms grow with it."""
    free = available_bytes()
    if on_gpu or free is None:
        return
    need = fp.training_bytes(batch, seq_len)
    if need > free:
        raise ConfigError(f"training needs at least {_gib(need)} ({fp.n_params:,} parameters, {batch}×{seq_len} "
                          f"tokens a step) but {_gib(free)} is available; lower model.d_model, model.n_layers, "
                          "data.batch_size or data.seq_len")
    if finetune_length:
        tune_batch = max(1, batch * seq_len // finetune_length)
        need = fp.training_bytes(tune_batch, finetune_length)
        if need > free:
            raise ConfigError(f"eval.finetune_length={finetune_length}: fine-tuning at {tune_batch}×{finetune_length} "
                              f"tokens a step needs at least {_gib(need)} but {_gib(free)} is available; shorten "
                              "eval.finetune_length or set eval.finetune_steps=0")
    for length in eval_lengths:
        eval_batch = max(1, batch * seq_len // length)  # harness/model/evaluate.py: constant tokens per batch
        need = fp.eval_bytes(eval_batch, length)
        if need > free:
            raise ConfigError(f"eval.lengths: scoring at L={length} needs at least {_gib(need)} but {_gib(free)} "
                              "is available; drop that length or shorten it")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
