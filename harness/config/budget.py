"""What a run costs, said by ``--check`` before it is paid for, and the two limits a run is held to.

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

from harness.config.estimates import blocks_params
from harness.errors import ConfigError


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
        return f" · {short_count(self.tokens)} tokens{epochs} · {self.flops:.1e} FLOPs{hours}{self.paper}"


def short_count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.1f}{unit}"
    return f"{n:,.0f}"


def budget_of(
    settings, trainer, data, task, model, vocab: int, n_params: int, train_tokens: int | None, paper: dict | None
) -> Budget:
    """The run's budget; refused past ``settings.max_epochs`` or off the paper's vocabulary (module docstring)."""
    length = task.sequence_tokens(data.seq_len)
    world = (trainer.processes() or 1) * trainer.num_nodes
    step = data.batch_size * length * world * trainer.accumulate_grad_batches
    tokens = trainer.max_steps * step
    n = blocks_params(model, vocab)  # N = L·(4·C² + m·C·F) + C·V (module docstring)
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
