"""Will it fit? A first gate, by formula, before the model is even laid out on the meta device.

A lower bound on purpose (a refusal must never stop a run that would have fitted): the transformer
blocks' fp32 weights, gradients and AdamW's two moments (16 bytes a parameter), the activations
autograd keeps per layer for the tokens of one step (input, q, k, v, attention output, the two
residual branches and the MLP's hidden and GELU: about 10·C + 2·F floats per token, Korthikanti et
al. 2022 §4.1 without the attention matrix), and the logits with their gradient (2·V floats per
token). A model of 2,000 layers takes seconds to lay out even on meta; this refuses it at once.
What a scheme or a variant makes large is measured after, by rehearsing the run (rehearsal.py).
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
    vocab: int

    @classmethod
    def of_blocks(cls, model, vocab: int) -> Footprint:
        """The transformer blocks and embeddings alone: per layer 4·C² + 2·C·F weights (attention, MLP),
        plus V·C embeddings."""
        c, f = model.d_model, model.d_ff
        params = model.n_layers * (4 * c * c + 2 * c * f) + vocab * c
        return cls(params, c, f, model.n_layers, vocab)

    def training_bytes(self, batch: int, length: int) -> int:
        tokens = batch * length
        activations = self.n_layers * tokens * (10 * self.d_model + 2 * self.d_ff) + 2 * tokens * self.vocab
        return 16 * self.n_params + FLOAT * activations


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


def check_memory(fp: Footprint, batch: int, seq_len: int, on_gpu: bool) -> None:
    """Refuse a run whose lower-bound footprint exceeds this machine's available memory (CPU runs), naming
    the keys of the larger term: the weights' or the tokens'."""
    free = available_bytes()
    if on_gpu or free is None:
        return
    need = fp.training_bytes(batch, seq_len)
    if need > free:
        weights = 16 * fp.n_params
        fix = (f"lower model.d_model={fp.d_model}, model.n_layers={fp.n_layers} or model.d_ff={fp.d_ff}"
               if weights > need - weights else f"lower data.batch_size={batch} or data.seq_len={seq_len}")
        raise ConfigError(f"training needs at least {gib(need)} ({gib(weights)} for {fp.n_params:,} parameters with "
                          f"their gradients and AdamW's moments, {gib(need - weights)} for {batch}×{seq_len} tokens "
                          f"a step) but {gib(free)} is available; {fix}")


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
