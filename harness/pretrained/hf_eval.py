"""``posbench hf-eval MODEL_DIR``: a pretrained causal LM under each RoPE scaling and factor, measured as the PI,
NTK, YaRN and LongPPL papers measured theirs, one MLflow run per (scaling, factor) under one parent run.

Per cell (harness/pretrained/measures.py defines each):
  - perplexity by context length L with sliding windows over the same first ``budget`` tokens at every L ->
    ``val/loss_at_<L>`` (nats/token), ``val/ppl_at_<L>``, and what it cost: ``cost/seconds_per_1k_tokens_at_<L>``
    (wall seconds per 1,000 tokens forwarded);
  - LongPPL at L: the loss on the key tokens — those whose loss an evaluator model improves by > 2 nats with the
    long context over a short one — ``key/loss_at_<L>``, ``key/ppl_at_<L>``; the key tokens are found once per L by
    one fixed evaluator (``--evaluator``: another folder with the same tokenizer, as the paper's; default the
    model as trained) so every cell is scored on the same tokens, ``key/count_at_<L>`` on the parent;
  - passkey retrieval by depth and length -> ``passkey/acc_at_<L>``, ``passkey/acc_at_<L>_depth_<d>``;
  - with ``--tasks VARIANTS``: posbench's RULER-style tasks (harness/data/tasks/ruler.py, the haystack from
    ``--text``) generated greedily -> ``ruler/<variant>_at_<L>``, RULER's share of the expected strings;
  - with ``--lm-eval TASKS``: lm-evaluation-harness's tasks on the cell's model, the RULER ones sized to each length
    (harness/pretrained/lm_eval_tasks.py) -> ``lm_eval/<task>_at_<L>``, the responses as ``lm_eval_samples.jsonl``;
  - with ``--finetune-steps N``: first N AdamW steps at ``--finetune-length`` under the cell's scaling (PI's
    protocol, harness/pretrained/finetune.py), the weights put back after the cell -> ``finetune/loss`` by step.

A claim (``--claim yarn<ntk<linear``, declared before anything runs) is judged on the loss at every length beyond the
model's trained context, at every factor: each adjacent pair of the ordering is a paired t test over blocks of
max(``stride``, 1024) consecutive labels (the same tokens under both cells; blocks this long, from consecutive
text, are nearly uncorrelated), the family corrected by Holm at ``--level``; supported when
every comparison rejects in the claimed direction, contradicted when one rejects against it, else inconclusive.

Before a weight is read, the model's config.json gives its parameters, the peak memory at the longest length (and of
a fine-tuning step) and the sweep's FLOPs (harness/pretrained/cost.py); a peak above the memory available is
refused with the figure. The scaling is posbench's own (rotary.py ``apply_scaling``, equal to transformers' through
its ``rope_parameters``). Nothing is fetched: the model is a local ``save_pretrained`` folder or posbench's
``export=hf``.

Notation: L context length, S stride, d depth (0: the key first, 1: last).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.data.tasks.ruler import VARIANTS
from harness.data.windows import window_count, window_starts
from harness.errors import ConfigError, OneLineParser, said_refusal
from harness.extras import require
from harness.pretrained import cost, folder, remapped, report, rope_parameters, rotary
from harness.pretrained.finetune import finetune
from harness.pretrained.lm_eval_tasks import GENERATED, build, scores
from harness.pretrained.measures import (
    key_tokens,
    passkey_retrieved,
    ruler_score,
    short_context_losses,
    token_losses,
)
from positional.rope_scaling import METHODS, yarn_attention_scale


@dataclass(frozen=True)
class EvalSpec:
    """What ``posbench hf-eval`` measures, typed and checked once (``parse``) before any weight is read."""

    model: Path
    scalings: tuple[str, ...] = ("none", "linear", "ntk", "yarn")
    factors: tuple[float, ...] = (2.0, 4.0)
    lengths: tuple[int, ...] = (256, 512, 1024)
    stride: int | None = None  # None: L / 2
    budget: int = 4096  # tokens scored at each length
    passkey_trials: int = 5  # prompts per (length, depth); 0: no passkey
    depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    text: str = "embedded"  # or a UTF-8 file
    experiment: str = "hf-eval"
    tracking_uri: str | None = None
    seed: int = 0
    check_only: bool = False  # --check: the options, the folder and the budget checked, no weight loaded
    key_short: int | None = None  # LongPPL's short context; None: half the shortest length; 0: no key tokens
    evaluator: Path | None = None  # LongPPL's evaluator model; None: the model as trained
    claim: tuple[str, ...] = ()  # an ordering of scalings by loss, best first: ("yarn", "ntk", "linear")
    level: float = 0.05  # the claim's family-wise level (Holm)
    margin: float = 0.01  # nats: a significant |Δ| below it is negligible, neither for nor against the claim
    finetune_steps: int = 0
    finetune_length: int | None = None  # None: the longest length
    finetune_lr: float = 2e-5
    finetune_batch: int = 1
    memory_gib: float | None = None  # None: what the device has available now
    gflops: float = 100.0  # the sustained rate the time estimate assumes
    out: Path | None = None  # also write the report there (README.md + report.csv)
    window: int | None = None  # Self-Extend's neighbour window; None: half the model's trained context
    tasks: tuple[str, ...] = ()  # posbench's RULER-style variants run on every cell
    task_trials: int = 5  # prompts per variant and length
    lm_eval: tuple[str, ...] = ()  # lm-evaluation-harness tasks run on every cell
    lm_eval_limit: int = 20  # documents per task (and per length for RULER's)
    lm_eval_lengths: tuple[int, ...] = ()  # RULER's lengths; (): --lengths

    def cells(self) -> list[tuple[str, float]]:
        """(scaling, factor) per run: ``none`` (and ``none+…``) once, every other scaling at every factor."""
        return [(m, 1.0) for m in self.scalings if unscaled(m)] + [
            (m, f) for m in self.scalings if not unscaled(m) for f in self.factors
        ]

    @property
    def task_lengths(self) -> tuple[int, ...]:
        """The lengths lm-eval's RULER tasks are generated at."""
        return self.lm_eval_lengths or self.lengths

    @property
    def tune_length(self) -> int:
        """The window --finetune-steps trains on."""
        return self.finetune_length or max(self.lengths)

    @property
    def short(self) -> int:
        return min(self.lengths) // 2 if self.key_short is None else self.key_short

    def stride_at(self, length: int) -> int:
        return self.stride or max(1, length // 2)


def parse(argv: list[str]) -> EvalSpec:
    """The command line as an ``EvalSpec``; a bad value is a ConfigError naming the fix."""
    a = _parser().parse_args(argv)
    claim = tuple(n.strip() for n in a.claim.split("<")) if a.claim.strip() else ()  # "<" alone: refused, not no claim
    spec = EvalSpec(
        Path(a.model).expanduser(),
        _names(a.scalings),
        _numbers("--factors", a.factors, float),
        _numbers("--lengths", a.lengths, int),
        a.stride,
        a.budget,
        a.passkey_trials,
        _numbers("--depths", a.depths, float),
        a.text,
        a.experiment,
        a.tracking_uri,
        a.seed,
        a.check,
        a.key_short,
        Path(a.evaluator).expanduser() if a.evaluator else None,
        claim,
        a.level,
        a.margin,
        a.finetune_steps,
        a.finetune_length,
        a.finetune_lr,
        a.finetune_batch,
        a.memory,
        a.gflops,
        Path(a.out) if a.out else None,
        a.window,
        tuple(n.strip() for n in a.tasks.split(",") if n.strip()),
        a.task_trials,
        tuple(n.strip() for n in a.lm_eval.split(",") if n.strip()),
        a.lm_eval_limit,
        _numbers("--lm-eval-lengths", a.lm_eval_lengths, int),
    )
    check(spec)
    return spec


def _parser() -> OneLineParser:
    p = OneLineParser(prog="posbench hf-eval", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a local directory in save_pretrained's format (config.json + weights)")
    for flag, kind, default, help in (  # as --help lists them
        (
            "--scalings",
            str,
            "none,linear,ntk,yarn",
            f"comma-separated, of {', '.join(METHODS)}, own; +resonance, +hope: posbench's θ (yarn+hope)",
        ),
        ("--factors", str, "2,4", "comma-separated scaling factors s (each scaling but none)"),
        ("--lengths", str, "256,512,1024", "comma-separated context lengths L, in tokens"),
        ("--stride", int, None, "sliding-window stride S (default L/2)"),
        (
            "--window",
            int,
            None,
            "self_extend's neighbour window W (default half the trained context); its factor is the group size",
        ),
        ("--budget", int, 4096, "tokens scored at each length"),
        ("--tasks", str, "", "comma-separated RULER-style variants: niah_single, …, vt, cwe, fwe"),
        ("--task-trials", int, 5, "prompts per --tasks variant and length"),
        (
            "--lm-eval",
            str,
            "",
            "lm-eval tasks run on every cell, RULER's sized to --lengths (offline: niah_single_1,ruler_vt,ruler_fwe)",
        ),
        ("--lm-eval-limit", int, 20, "documents per lm-eval task (and per length)"),
        ("--lm-eval-lengths", str, "", "comma-separated lengths of RULER's tasks (default --lengths)"),
        ("--passkey-trials", int, 5, "passkey prompts per length and depth (0: none)"),
        ("--depths", str, "0,0.5,1", "comma-separated passkey depths in [0, 1]"),
        ("--text", str, "embedded", "embedded (the stdlib prose's validation split) or a file"),
        (
            "--key-short",
            int,
            None,
            "LongPPL's short context in tokens (default half the shortest length; 0: no key tokens)",
        ),
        (
            "--evaluator",
            str,
            None,
            "LongPPL's evaluator: a model folder with the same tokenizer (default: the model as trained)",
        ),
        ("--claim", str, "", "an ordering by loss beyond the trained context, best first: yarn<ntk<linear"),
        ("--level", float, 0.05, "the claim's family-wise level, Holm-corrected"),
        ("--margin", float, 0.01, "nats: a smaller |Δ| is negligible for the claim"),
        ("--finetune-steps", int, 0, "PI's short fine-tune per cell first (0: none)"),
        ("--finetune-length", int, None, "its window (default the longest length)"),
        ("--finetune-lr", float, 2e-5, None),
        ("--finetune-batch", int, 1, None),
        ("--memory", float, None, "GiB the run may use (default: available now)"),
        ("--gflops", float, 100.0, "the sustained GFLOP/s the time estimate assumes"),
        ("--out", str, None, "also write the report to this folder (README.md, report.csv)"),
        ("--experiment", str, "hf-eval", "the MLflow experiment"),
        ("--tracking-uri", str, None, "default: $MLFLOW_TRACKING_URI, else <root>/mlflow.db"),
        ("--seed", int, 0, None),
    ):
        p.add_argument(flag, type=kind, default=default, help=help)
    p.add_argument("--check", action="store_true", help="check the options, folder and budget; load nothing")
    return p


MODIFIERS = ("resonance", "hope")  # posbench's θ beyond transformers': yarn+resonance, none+hope
OWN = "own"  # the model's own rope_parameters (Llama 3.1's llama3, a YaRN-extended yarn), as transformers runs it
# remapped positions over the model's own RoPE (harness/pretrained/remapped.py): Self-Extend (factor: its group size)
# and Dual Chunk Attention (at factor 1)
SELF_EXTEND, DCA = "self_extend", "dca"


def unscaled(name: str) -> bool:
    """A cell at factor 1: the plain θ (``none``), the model's own scaling (``own``) or DCA."""
    return name.split("+")[0] in ("none", OWN, DCA)


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [
        n
        for n in names
        if n.split("+")[0] not in (*METHODS, OWN, SELF_EXTEND, DCA)
        or any(m not in MODIFIERS for m in n.split("+")[1:])
        or len(set(n.split("+"))) < len(n.split("+"))
    ]
    if unknown or not names:
        raise ConfigError(
            f"--scalings={text}: {', '.join(unknown) or 'none given'} unknown; use some of "
            f"{', '.join(METHODS)}, own (the model's own rope_parameters), self_extend or dca, each optionally "
            "+resonance and/or +hope (yarn+resonance)"
        )
    return names


def _numbers(flag: str, text: str, kind) -> tuple:
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag}={text}: give comma-separated {'integers' if kind is int else 'numbers'}") from None


def check(spec: EvalSpec) -> None:
    """Every value's range, the model directory and what the run will cost, before any weight is loaded."""
    if not spec.lengths or any(n < 2 for n in spec.lengths):
        raise ConfigError(f"--lengths={','.join(map(str, spec.lengths))}: give context lengths of at least 2 tokens")
    unknown_task = next((t for t in spec.tasks if t not in VARIANTS), None)
    block = max(report.BLOCK, spec.stride_at(max(spec.lengths)))  # the claim's at the longest length
    for ok, refusal in (  # in this order: the first that fails is said
        (
            all(1 <= f < math.inf for f in spec.factors),
            f"--factors={','.join(map(str, spec.factors))}: scaling factors are finite and ≥ 1",
        ),
        (
            all(0 <= d <= 1 for d in spec.depths),
            f"--depths={','.join(map(str, spec.depths))}: depths lie in [0, 1] (0: the key first)",
        ),
        (
            all(s.split("+")[0] != SELF_EXTEND for s in spec.scalings) or all(f % 1 == 0 for f in spec.factors),
            f"--factors={','.join(f'{f:g}' for f in spec.factors)}: self_extend's factor is its group size, a whole "
            "number",
        ),
        (
            spec.window is None or spec.window >= 1,
            f"--window={spec.window}: Self-Extend's neighbour window is a positive number of tokens",
        ),
        (
            spec.stride is None or 0 < spec.stride <= min(spec.lengths),
            f"--stride={spec.stride} must lie in 1 … the shortest length {min(spec.lengths)}",
        ),
        (
            spec.budget >= max(spec.lengths) and spec.passkey_trials >= 0,
            f"--budget={spec.budget} must cover the longest length {max(spec.lengths)} and "
            f"--passkey-trials={spec.passkey_trials} be ≥ 0",
        ),
        (
            spec.key_short is None or 0 <= spec.key_short < max(spec.lengths),
            f"--key-short={spec.key_short}: LongPPL's short context lies in 1 … the longest length − 1 "
            f"({max(spec.lengths) - 1}), or 0 for no key tokens",
        ),
        (0 < spec.level < 1, f"--level={spec.level}: it lies in (0, 1)"),
        (0 <= spec.margin < math.inf, f"--margin={spec.margin}: it is ≥ 0 (nats)"),
        (0 < spec.gflops < math.inf, f"--gflops={spec.gflops}: it is a positive rate"),
        (
            spec.memory_gib is None or 0 < spec.memory_gib < math.inf,
            f"--memory={spec.memory_gib}: it is a positive number of GiB",
        ),
        (
            spec.finetune_steps >= 0 and spec.finetune_batch >= 1 and 0 < spec.finetune_lr < math.inf,
            f"--finetune-steps={spec.finetune_steps} ≥ 0, --finetune-batch={spec.finetune_batch} ≥ 1 "
            f"and --finetune-lr={spec.finetune_lr} > 0",
        ),
        (
            spec.finetune_length is None or spec.finetune_length >= 2,
            f"--finetune-length={spec.finetune_length}: at least 2 tokens",
        ),
        (
            all(n >= 2 for n in spec.lm_eval_lengths),
            f"--lm-eval-lengths={','.join(map(str, spec.lm_eval_lengths))}: each must be 2 tokens or more",
        ),
        (
            unknown_task is None,
            f"--tasks={','.join(spec.tasks)}: {unknown_task} is no task; use {', '.join(VARIANTS)}",
        ),
        (
            spec.task_trials >= 1,
            f"--task-trials={spec.task_trials} must be at least 1 (prompts per variant and length)",
        ),
        (spec.lm_eval_limit >= 1, f"--lm-eval-limit={spec.lm_eval_limit} must be at least 1 (documents per task)"),
        (
            bool(spec.experiment.strip()),
            "--experiment '' names no MLflow experiment; give a name, e.g. --experiment hf-eval",
        ),
        (0 <= spec.seed <= 2**32 - 1, f"--seed={spec.seed} must lie in [0, 2^32 − 1]"),
        (
            not spec.claim
            or (
                len(spec.claim) >= 2
                and len(set(spec.claim)) == len(spec.claim)
                and all(m in spec.scalings for m in spec.claim)
            ),
            f"--claim={'<'.join(spec.claim)}: order two or more distinct scalings of --scalings "
            f"({','.join(spec.scalings)}), best first; e.g. yarn<ntk<linear",
        ),
        (
            not spec.claim or spec.budget >= 2 * block,
            f"--claim at --budget={spec.budget}: its t test compares blocks of {block} consecutive labels, two at "
            f"least; give --budget ≥ {2 * block}",
        ),
        *(  # the counts a flag can make large: a run no machine finishes is refused at once
            (value is None or value <= most, f"{flag}={value} is more than an evaluation takes; give at most {most:,}")
            for flag, value, most in (
                ("--lengths", max(spec.lengths), 2**24),
                ("--budget", spec.budget, 10**9),
                ("--passkey-trials", spec.passkey_trials, 10_000),
                ("--finetune-steps", spec.finetune_steps, 10**6),
                ("--finetune-length", spec.finetune_length, 2**24),
                ("--finetune-batch", spec.finetune_batch, 4096),
                ("--lm-eval-limit", spec.lm_eval_limit, 100_000),
                ("--task-trials", spec.task_trials, 10_000),
            )
        ),
    ):
        if not ok:
            raise ConfigError(refusal)
    _check_paths(spec)
    if spec.lm_eval:
        build(spec.model, spec.lm_eval, spec.task_lengths)
    config = folder.read_config(spec.model).as_dict()
    _check_claim(spec, config)
    _check_budget(spec, config)
    for path in (spec.model, spec.evaluator):  # weights' headers and shapes, tokenizer, family: before a weight loads
        if path is not None:
            note = folder.unverified(folder.read(path))
            if note:
                print(note, file=sys.stderr)


def _check_paths(spec: EvalSpec) -> None:
    """The model folders hold a config.json (a Hub name is refused: nothing is downloaded), --text is a file,
    --out may be written, the store opens."""
    for path, flag in ((spec.model, "MODEL_DIR"), (spec.evaluator, "--evaluator")):
        if path is not None and not (path / "config.json").is_file():
            hub = not path.exists() and "/" in str(path) and not str(path).startswith((".", "/", "~"))
            hint = (
                " (a Hub name? nothing is downloaded: save the model with save_pretrained and give its folder)"
                if hub
                else ""
            )
            raise ConfigError(f"{flag} {path} is not a model folder with a config.json{hint}")
        if path is not None:  # its config and its seal (harness/pretrained/folder.py); the rest after the budget
            folder.read(path, contents=False)
    if spec.text != "embedded":
        text = Path(spec.text).expanduser()
        if not text.is_file():
            raise ConfigError(f"--text={spec.text} is no file; give a UTF-8 text file or embedded")
        try:
            text.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"--text={spec.text} is not UTF-8 (bad byte at offset {e.start:,}); convert it (iconv "
                "-t utf-8) or give another file"
            ) from None
    from harness.record.preflight import output_dir, store_to_write

    if spec.out is not None:
        output_dir(spec.out, "--out")  # before the sweep, not after it
    store_to_write(spec.tracking_uri)  # the store the cells are logged to: opened (or made) before any is run


def trained_context(config: dict) -> int | None:
    """The context the model was trained at: its rope parameters' original length (where they are per layer type,
    Gemma 3's, the shortest layer type's, as rotary.apply_scaling takes it), else max_position_embeddings."""
    rope = rope_parameters.of_config(config)  # as rotary.scaling_of reads it
    sets = rope.values() if rope_parameters.per_layer_type(rope) else [rope]
    originals = (p["original_max_position_embeddings"] for p in sets if p and p.get("original_max_position_embeddings"))
    n = min(originals, default=config.get("max_position_embeddings"))
    return int(n) if isinstance(n, int | float) and n > 0 else None


def _check_claim(spec: EvalSpec, config: dict) -> None:
    if not spec.claim:
        return
    context = trained_context(config)
    if context is None or not any(n > context for n in spec.lengths):
        raise ConfigError(
            f"--claim is judged beyond the trained context ({context or 'unknown'} tokens, "
            f"max_position_embeddings): add a --lengths value above it"
        )


SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def costs(spec: EvalSpec, config: dict) -> tuple[dict[str, float], float]:
    """(the peak's parts in bytes, the sweep's FLOPs) from config.json and the model built on the meta device."""
    generated = max(spec.task_lengths) + GENERATED if spec.lm_eval else 0  # a prompt and RULER's longest answer
    every, multiplied = cost.parameters(spec.model)
    peak = cost.evaluation_bytes(config, max(*spec.lengths, generated), every)
    if spec.finetune_steps:
        peak = max(peak, cost.finetune_bytes(config, spec.tune_length, every), key=lambda parts: sum(parts.values()))
    if spec.evaluator is not None:
        peak = {**peak, "evaluator weights": 4.0 * cost.parameters(spec.evaluator)[0]}
    if spec.finetune_steps:
        peak = {**peak, "pretrained weights kept": 4.0 * every}
    # per length: its windows, its passkey prompts, a --tasks prompt's about 48 forwards (its answer and 8 tokens
    # more, no cache)
    prompts = spec.passkey_trials * len(spec.depths) + 48 * spec.task_trials * len(spec.tasks)
    per_cell = sum(
        (window_count(spec.budget, n, spec.stride_at(n)) + prompts) * cost.forward_flops(config, n, multiplied)
        for n in spec.lengths
    )
    per_cell += sum(  # --lm-eval, per document and task: a prompt's forward, and its answer's about as much again
        2 * spec.lm_eval_limit * len(spec.lm_eval) * cost.forward_flops(config, n, multiplied)
        for n in spec.task_lengths
    )
    per_cell += 3 * spec.finetune_steps * spec.finetune_batch * cost.forward_flops(config, spec.tune_length, multiplied)
    return peak, per_cell * len(spec.cells())


def _check_budget(spec: EvalSpec, config: dict) -> None:
    missing = [k for k in SIZES if k not in config]
    if missing:
        raise ConfigError(
            f"{spec.model}/config.json (model_type {config.get('model_type')!r}) lacks "
            f"{', '.join(missing)}: hf-eval reads RoPE decoders as transformers describes Llama, "
            "Mistral, Qwen2 or GPT-NeoX; give such a model"
        )
    # DeepSeek's latent attention (qk_rope_head_dim) multiplies its logits by YaRN's mscale(s, mscale_all_dim)² when
    # transformers builds it (``yarn_apply_mscale``); no rotary swap takes it out
    rope = rope_parameters.of_config(config) if config.get("qk_rope_head_dim") else {}
    kept = (
        yarn_attention_scale(max(rope.get("factor") or 1.0, 1.0), rope.get("mscale_all_dim") or 0.0) ** 2
        if rope.get("rope_type", "default") != "default"
        else 1.0
    )
    if kept != 1 and any(n.split("+")[0] not in (OWN, SELF_EXTEND, DCA) for n in spec.scalings):  # own: as built
        raise ConfigError(
            f"--scalings={','.join(spec.scalings)}: {spec.model.name}'s attention multiplies its logits by YaRN's "
            f"mscale² (mscale_all_dim={rope['mscale_all_dim']:g} at factor {rope['factor']:g}) = {kept:.4g} as "
            "transformers builds it, which another scaling would keep; evaluate its own (own, self_extend, dca)"
        )
    remaps = [n for n in spec.scalings if n.split("+")[0] in (SELF_EXTEND, DCA)]
    if remaps and len(rotary.layer_types_of(config)) > 1:  # as remapped.apply_remapped refuses it
        raise ConfigError(
            f"--scalings={','.join(spec.scalings)}: {remaps[0]} re-rotates whole heads by one θ; "
            f"{spec.model.name} has a θ per layer type ({', '.join(map(str, rotary.layer_types_of(config)))}): drop "
            f"{', '.join(remaps)}"
        )
    peak, _ = costs(spec, config)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where load() puts the model
    have = spec.memory_gib * cost.GIB if spec.memory_gib else cost.available_bytes(device)
    if sum(peak.values()) > have:
        raise ConfigError(
            f"{spec.model.name} at L={max(spec.lengths)} needs ≈ {cost.describe(peak)} > "
            f"{have / cost.GIB:.1f} GiB available: shorter --lengths, a smaller model, or --memory "
            "if more is free"
        )


def plan(spec: EvalSpec, starting: bool = False) -> str:
    """What ``--check`` prints (and a run, as it starts): cells, parameters, peak memory, FLOPs and time at
    ``--gflops``, the fine-tuning steps included."""
    config = folder.read_config(spec.model).as_dict()
    peak, flops = costs(spec, config)
    return (
        f"{'hf-eval' if starting else 'ok'}: {len(spec.cells())} cells (scaling × factor) at lengths "
        f"{', '.join(map(str, spec.lengths))} on {spec.model}: {cost.parameters(spec.model)[0]:,} parameters, "
        f"peak ≈ {cost.describe(peak)}; ≈ {flops / 1e12:,.2f} TFLOP, {cost.hours(flops, spec.gflops)} at "
        f"{spec.gflops:g} GFLOP/s (--gflops)"
        + ("; Ctrl-C stops it, its runs closed KILLED" if starting else "; nothing loaded")
    )


# ---------------------------------------------------------------- the model and its text


def load(path: Path):
    """(model in fp32, eval mode, no KV cache; encode: str -> list of ids) from a local folder (read and checked
    by harness/pretrained/folder.py before)."""
    require("posbench hf-eval", ("transformers",))
    import transformers

    transformers.utils.logging.disable_progress_bar()  # what goes wrong is one line, not the library's bars before it
    transformers.utils.logging.set_verbosity_error()
    try:  # SDPA: no L × L matrix, the memory cost.py counts
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True, attn_implementation="sdpa"
        ).eval()
    except ValueError:  # a family without SDPA: its default (eager) attention, beyond the estimate
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        ).eval()
    model.config.use_cache = False  # one forward per window: a cache would only hold memory
    folder.check_finite(model, path)
    if torch.cuda.is_available():
        model = model.cuda()
    tok = folder.tokenizer(path)
    return model, lambda text: tok.encode(text, add_special_tokens=False)


def evaluation_text(text: str, split: str = "val") -> str:
    if text == "embedded":
        from harness.data.corpus import Embedded

        data = Embedded().load()
        return (data.val if split == "val" else data.train).decode("utf-8", errors="replace")
    return Path(text).expanduser().read_text(encoding="utf-8")


# ---------------------------------------------------------------- the measurements


def find_key_tokens(evaluator, ids: torch.Tensor, spec: EvalSpec) -> dict[int, torch.Tensor]:
    """LongPPL's key-token mask per length > the short context, from the one evaluator (measures.py), with the RoPE
    its own config gives it (a long-context evaluator keeps its own scaling; the model itself is taken as trained)."""
    if not spec.short:
        return {}
    rotary.apply_scaling(evaluator)  # its own rope_parameters: transformers' own rotary, to ≤ 1e-5 (test_pretrained.py)
    short = short_context_losses(evaluator, ids, spec.short, spec.budget)
    return {
        n: key_tokens(token_losses(evaluator, ids, n, spec.stride_at(n), spec.budget), short)
        for n in spec.lengths
        if n > spec.short + max(1, spec.short // 4) - 1  # longer than the short windows
    }


def measure(
    model, encode, ids: torch.Tensor, spec: EvalSpec, keys: dict[int, torch.Tensor] | None = None
) -> tuple[dict[str, float], dict[int, torch.Tensor]]:
    """One cell's metrics (loss, perplexity and cost by length; LongPPL where ``keys`` has key tokens; passkey
    accuracy by length and depth), and its per-label losses by length."""
    out: dict[str, float] = {}
    losses: dict[int, torch.Tensor] = {}
    for length in spec.lengths:
        started = time.perf_counter()
        losses[length] = nll = token_losses(model, ids, length, spec.stride_at(length), spec.budget)
        forwarded = sum(min(length, len(ids) - 1 - s) for s in window_starts(len(nll), length, spec.stride_at(length)))
        out[f"cost/seconds_per_1k_tokens_at_{length}"] = (time.perf_counter() - started) / forwarded * 1000
        mask = (keys or {}).get(length)
        scored = {"val": nll, **({"key": nll[mask]} if mask is not None and mask.any() else {})}
        for split, values in scored.items():
            loss = float(values.mean())
            out[f"{split}/loss_at_{length}"], out[f"{split}/ppl_at_{length}"] = loss, math.exp(min(loss, 700.0))
    if spec.passkey_trials:
        filler = ids.tolist()
        keys_ = torch.randint(
            10_000, 100_000, (spec.passkey_trials,), generator=torch.Generator().manual_seed(spec.seed)
        ).tolist()
        for length in spec.lengths:
            hits = {d: [passkey_retrieved(model, encode, filler, length, d, k) for k in keys_] for d in spec.depths}
            if any(None in trials for trials in hits.values()):
                continue  # the prompt does not fit: no figure rather than a wrong one
            out.update({f"passkey/acc_at_{length}_depth_{d:g}": t.count(True) / len(t) for d, t in hits.items()})
            out[f"passkey/acc_at_{length}"] = sum(hits[d].count(True) for d in spec.depths) / (
                len(keys_) * len(spec.depths)
            )
    return out, losses


# ---------------------------------------------------------------- the sweep, in MLflow


def run(spec: EvalSpec, command: str = "") -> tuple[str, dict[tuple[str, float], dict[str, float]], list[dict], str]:
    """Every cell as a child run of one parent run; returns (the parent's run id, metrics by cell, the claim's
    comparisons, the report). ``command``: the command line, quoted in the report with the wall time."""
    began = time.perf_counter()
    from harness.record.run import TrackedRun
    from harness.record.store import resolve_tracking_uri

    model, encode = load(spec.model)
    device = next(model.parameters()).device
    ids, tune_ids = _token_ids(spec, encode, model.get_input_embeddings().num_embeddings, device)
    print(plan(spec, starting=True), flush=True)  # the model loaded, its weights and ids checked: the sweep begins
    keys = _key_tokens(spec, model, encode, ids)
    context = trained_context(model.config.to_dict()) or 0
    uri = resolve_tracking_uri(spec.tracking_uri)
    params = _params(spec, model.config.max_position_embeddings, context)
    parent = TrackedRun(uri, spec.experiment, f"hf-eval {spec.model.name}")
    results: dict[tuple[str, float], dict[str, float]] = {}
    losses: dict[tuple[str, float], dict[int, torch.Tensor]] = {}
    pretrained = {k: v.detach().clone() for k, v in model.state_dict().items()} if spec.finetune_steps else None
    with parent.open({"kind": "hf-eval"}, params):
        parent.log_scalars({f"key/count_at_{n}": float(m.sum()) for n, m in keys.items()}, 0)
        for method, factor in spec.cells():
            remap = _remap(spec, model, method, factor)
            child = TrackedRun(
                uri,
                spec.experiment,
                remap.name() if remap else f"{method} x{factor:g}",
                {"mlflow.parentRunId": parent.run_id or "", "scaling": method, "factor": f"{factor:g}"},
            )
            with child.open({"kind": "hf-eval-cell"}, {**params, "scaling": method, "factor": f"{factor:g}"}):
                results[method, factor], losses[method, factor] = _cell(
                    model, encode, ids, spec, keys, method, factor, tune_ids, child
                )
                if pretrained is not None:
                    model.load_state_dict(pretrained)
            print(
                f"{method} x{factor:g}: "
                + ", ".join(f"{k}={v:.4g}" for k, v in results[method, factor].items() if k.startswith("val/loss"))
            )
        rows = report.judge(spec, context, losses) if spec.claim else []
        if rows:
            parent.set_tags({"claim_verdict": report.verdict(rows)})
        files = report.files(spec, results, rows, keys, context, command, time.perf_counter() - began, parent.run_id)
        parent.log_files(files)
        if spec.out is not None:
            report.write(spec.out, files)
    return parent.run_id or "", results, rows, str(files["hf_eval.md"])


def _remap(spec: EvalSpec, model, method: str, factor: float):
    """The remapped positions of a ``self_extend`` or ``dca`` cell, else None. From the model's trained context L:
    Self-Extend's window --window, else L/2 (its group size the factor); DCA's chunk 11L/16 and local window L/16,
    the authors' defaults (chunk + local = 3L/4)."""
    from positional.rope_remapped import DualChunk, SelfExtend

    context = trained_context(model.config.to_dict()) or model.config.max_position_embeddings
    if method == SELF_EXTEND:
        return SelfExtend(int(factor), spec.window or max(1, context // 2))
    return DualChunk.fitting(context) if method == DCA else None


def _token_ids(spec: EvalSpec, encode, rows: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The evaluated text's ids (the budget plus the longest length), and with --finetune-steps the fine-tuning
    text's, on ``device``; refused where the tokenizer gives an id the model's ``rows`` embeddings do not hold."""
    ids = torch.tensor(encode(evaluation_text(spec.text))[: spec.budget + max(spec.lengths) + 1], device=device)
    if len(ids) < max(spec.lengths) + 1:
        raise ConfigError(f"--text={spec.text} holds {len(ids)} tokens, fewer than the longest length + 1")
    if int(ids.max()) >= rows:
        raise ConfigError(
            f"{spec.model}'s tokenizer gives id {int(ids.max())} for this text and its model embeds {rows} ids: "
            "another model's tokenizer; save the model's own tokenizer beside it (tokenizer.save_pretrained)"
        )
    if not spec.finetune_steps:
        return ids, None
    split = "train" if spec.text == "embedded" else "val"  # a user's file: the text itself, said in the report
    train_ids = torch.tensor(encode(evaluation_text(spec.text, split)), device=device)
    if len(train_ids) < spec.tune_length + 2:
        raise ConfigError(f"the fine-tuning text holds {len(train_ids)} tokens, fewer than --finetune-length + 2")
    return ids, train_ids


def _key_tokens(spec: EvalSpec, model, encode, ids: torch.Tensor) -> dict:
    """LongPPL's key tokens of ``ids``, picked by --evaluator's losses (a model of the same tokenizer), else the
    evaluated model's."""
    evaluator = model
    if spec.evaluator is not None:
        evaluator, encode_evaluator = load(spec.evaluator)
        if encode_evaluator(evaluation_text(spec.text)[:2000]) != encode(evaluation_text(spec.text)[:2000]):
            raise ConfigError(
                f"--evaluator {spec.evaluator} tokenizes the text differently: LongPPL's key tokens "
                "need the evaluated model's tokenizer (give an evaluator of the same family)"
            )
    return find_key_tokens(evaluator, ids.to(next(evaluator.parameters()).device), spec)


def _params(spec: EvalSpec, max_positions: int, context: int) -> dict[str, str]:
    """The parent run's (and each cell's) parameters: what was evaluated, how, and against which claim."""
    return {
        "model": str(spec.model),
        "lengths": ",".join(map(str, spec.lengths)),
        "stride": str(spec.stride),
        "budget": str(spec.budget),
        "passkey_trials": str(spec.passkey_trials),
        "depths": ",".join(f"{d:g}" for d in spec.depths),
        "text": spec.text,
        "seed": str(spec.seed),
        "max_position_embeddings": str(max_positions),
        "trained_context": str(context),
        "key_short": str(spec.short),
        "evaluator": str(spec.evaluator or "the model as trained"),
        "claim": "<".join(spec.claim),
        "level": str(spec.level),
        "margin": str(spec.margin),
        "finetune_steps": str(spec.finetune_steps),
        "finetune_length": str(spec.tune_length if spec.finetune_steps else None),
        "finetune_lr": str(spec.finetune_lr),
        "finetune_batch": str(spec.finetune_batch),
        "lm_eval": ",".join(spec.lm_eval),
        "lm_eval_limit": str(spec.lm_eval_limit),
        "lm_eval_lengths": ",".join(map(str, spec.task_lengths)) if spec.lm_eval else "",
    }


def _cell(
    model, encode, ids: torch.Tensor, spec: EvalSpec, keys, method: str, factor: float, tune_ids, child
) -> tuple[dict[str, float], dict[int, torch.Tensor]]:
    """One scaling × factor: the model's RoPE rescaled (and fine-tuned on ``tune_ids``, the fine-tuning text), then
    measured; logged to ``child``. The caller puts the pretrained weights back."""
    started = time.perf_counter()
    base, *mods = method.split("+")
    remap = _remap(spec, model, base, factor)
    rotary.apply_scaling(
        model,
        resonance="resonance" in mods,
        hope="hope" in mods,
        method=None if remap or base == OWN else base,
        factor=factor,
    )  # method None: the model's own scaling
    attention = model.config._attn_implementation
    if remap:
        remapped.apply_remapped(model, remap)
    if tune_ids is not None:
        curve = finetune(
            model, tune_ids, spec.tune_length, spec.finetune_steps, spec.finetune_lr, spec.finetune_batch, spec.seed
        )
        for step, value in enumerate(curve):
            child.log_scalars({"finetune/loss": value}, step)
    metrics, losses = measure(model, encode, ids, spec, keys)
    for variant in spec.tasks:
        decode = folder.tokenizer(spec.model).decode
        for length in spec.lengths:
            score = ruler_score(model, encode, decode, ids.tolist(), variant, length, spec.task_trials, spec.seed)
            if score is not None:  # a prompt that does not fit: no figure rather than a wrong one
                metrics[f"ruler/{variant}_at_{length}"] = score
    if spec.lm_eval:
        scored, samples = scores(model, spec.model, spec.lm_eval, spec.task_lengths, spec.lm_eval_limit, spec.seed)
        metrics.update(scored)
        child.log_files({"lm_eval_samples.jsonl": samples})
    model.set_attn_implementation(attention)  # remapped positions: only for their own cell
    diverged = [k for k, v in metrics.items() if k.startswith("val/loss") and not math.isfinite(v)]
    if diverged:  # weights that overflow float32 (a finite but huge value) give NaN losses: not a measurement
        raise ConfigError(
            f"{spec.model}: the loss under {method} x{factor:g} is not finite ({diverged[0]}): its "
            "weights overflow in float32; check the folder's weights (re-save the model)"
        )
    child.log_scalars({**metrics, "seconds": time.perf_counter() - started}, 0)
    return metrics, losses


def main(argv: list[str]) -> int:
    import shlex

    from harness.signals import said_stop, terminating

    try:
        spec = parse(argv)
        if spec.check_only:
            print(plan(spec))
            return 0
        with terminating():  # SIGTERM as Ctrl-C: every run open is closed KILLED (TrackedRun.open)
            parent, _, _, text = run(spec, " ".join(["posbench", "hf-eval", *(shlex.quote(a) for a in argv)]))
    except ConfigError as e:
        return said_refusal(e)
    except (KeyboardInterrupt, SystemExit) as e:
        return said_stop(e, "the hf-eval runs are closed KILLED; run the same command again to evaluate from the start")
    print(text, end="")
    where = f" and {spec.out}/README.md" if spec.out else ""
    print(f"parent run {parent} in experiment {spec.experiment}: hf_eval.md, hf_eval.csv, hf_eval_loss.png{where}")
    return 0
