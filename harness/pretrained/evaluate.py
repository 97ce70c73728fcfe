"""``posbench hf-eval MODEL_DIR``: a pretrained causal LM under each RoPE scaling and factor, measured as the PI,
NTK and YaRN papers measured theirs, one MLflow run per (scaling, factor) under one parent run.

Per cell:
  - perplexity by context length L with sliding windows (YaRN's eval/perplexity.py; Press et al. 2022, App. B):
    windows of L tokens advancing ``stride``, each scoring the tokens the previous one did not reach, over the
    same first ``budget`` tokens of the text at every L -> ``val/loss_at_<L>`` (nats/token), ``val/ppl_at_<L>``;
  - passkey retrieval (Mohtashami & Jaggi 2023, as PI §3.2 runs it): a five-digit key in filler text at depth d
    of a prompt of L tokens, then "What is the pass key? The pass key is" — retrieved when greedy decoding gives
    the key, i.e. when every key token is the argmax given the prompt and the key tokens before it (one forward,
    the same answer as decoding) -> ``passkey/acc_at_<L>``, ``passkey/acc_at_<L>_depth_<d>``.

The scaling is posbench's own (harness/pretrained/rotary.py ``apply_scaling``: equal to transformers' through its
``rope_parameters``, tests/test_hf_rope_parity.py), applied to the model's plain θ at each factor; the model is read
from a local directory (``save_pretrained``'s format, or posbench's ``export=hf``): nothing is fetched.

Notation: L context length, S stride, d depth (0: the key first, 1: last).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.errors import ConfigError
from positional.rope_scaling import METHODS

NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is "


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
    check_only: bool = False  # --check: the options and the folder checked, nothing loaded

    def cells(self) -> list[tuple[str, float]]:
        """(scaling, factor) per run: ``none`` once (the model as trained), every other scaling at every factor."""
        return [(m, 1.0) for m in self.scalings if m == "none"] + \
            [(m, f) for m in self.scalings if m != "none" for f in self.factors]


def parse(argv: list[str]) -> EvalSpec:
    """The command line as an ``EvalSpec``; a bad value is a ConfigError naming the fix."""
    p = argparse.ArgumentParser(prog="posbench hf-eval", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a local directory in save_pretrained's format (config.json + weights)")
    p.add_argument("--scalings", default="none,linear,ntk,yarn", help=f"comma-separated, of {', '.join(METHODS)}")
    p.add_argument("--factors", default="2,4", help="comma-separated scaling factors s (each scaling but none)")
    p.add_argument("--lengths", default="256,512,1024", help="comma-separated context lengths L, in tokens")
    p.add_argument("--stride", type=int, default=None, help="sliding-window stride S (default L/2)")
    p.add_argument("--budget", type=int, default=4096, help="tokens scored at each length")
    p.add_argument("--passkey-trials", type=int, default=5, help="passkey prompts per length and depth (0: none)")
    p.add_argument("--depths", default="0,0.5,1", help="comma-separated passkey depths in [0, 1]")
    p.add_argument("--text", default="embedded", help="embedded (the stdlib prose's validation split) or a file")
    p.add_argument("--experiment", default="hf-eval", help="the MLflow experiment")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else <root>/mlflow.db")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="check the options and the folder only; load nothing")
    a = p.parse_args(argv)
    spec = EvalSpec(Path(a.model).expanduser(), _names(a.scalings), _numbers("--factors", a.factors, float),
                    _numbers("--lengths", a.lengths, int), a.stride, a.budget, a.passkey_trials,
                    _numbers("--depths", a.depths, float), a.text, a.experiment, a.tracking_uri, a.seed, a.check)
    check(spec)
    return spec


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise ConfigError(f"--scalings={text}: {', '.join(unknown) or 'none given'} unknown; use some of "
                          f"{', '.join(METHODS)}")
    return names


def _numbers(flag: str, text: str, kind) -> tuple:
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag}={text}: give comma-separated {'integers' if kind is int else 'numbers'}") from None


def check(spec: EvalSpec) -> None:
    """Every value's range, and the model directory, before anything is loaded."""
    if not spec.lengths or any(n < 2 for n in spec.lengths):
        raise ConfigError(f"--lengths={','.join(map(str, spec.lengths))}: give context lengths of at least 2 tokens")
    if any(not (math.isfinite(f) and f >= 1) for f in spec.factors):
        raise ConfigError(f"--factors={','.join(map(str, spec.factors))}: scaling factors are finite and ≥ 1")
    if any(not 0 <= d <= 1 for d in spec.depths):
        raise ConfigError(f"--depths={','.join(map(str, spec.depths))}: depths lie in [0, 1] (0: the key first)")
    if spec.stride is not None and not 0 < spec.stride <= min(spec.lengths):
        raise ConfigError(f"--stride={spec.stride} must lie in 1 … the shortest length {min(spec.lengths)}")
    if spec.budget < max(spec.lengths) or spec.passkey_trials < 0:
        raise ConfigError(f"--budget={spec.budget} must cover the longest length {max(spec.lengths)} and "
                          f"--passkey-trials={spec.passkey_trials} be ≥ 0")
    if not (spec.model / "config.json").is_file():
        hint = " (a Hub name? nothing is downloaded: save the model with save_pretrained and give its folder)" \
            if not spec.model.exists() and "/" in str(spec.model) and not str(spec.model).startswith((".", "/")) else ""
        raise ConfigError(f"{spec.model} is not a model folder with a config.json{hint}")
    if spec.text != "embedded" and not Path(spec.text).expanduser().is_file():
        raise ConfigError(f"--text={spec.text} is no file; give a UTF-8 text file or embedded")


# ---------------------------------------------------------------- the model and its text


def load(folder: Path):
    """(model in fp32, eval mode; encode: str -> list of ids) from a local folder."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ConfigError("posbench hf-eval needs transformers: pip install 'posbench[hf]'") from None
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    own = json.loads((folder / "config.json").read_text()).get("posbench_tokenizer")
    if own == "byte":  # posbench's export of a byte-level model: the ids are the UTF-8 bytes
        return model, lambda text: list(text.encode("utf-8"))
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ConfigError(f"{folder} holds no tokenizer (tokenizer.json) and is no byte-level posbench export; "
                          "save the tokenizer beside the model (tokenizer.save_pretrained)")
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model, lambda text: tok.encode(text, add_special_tokens=False)


def evaluation_text(text: str) -> str:
    if text == "embedded":
        from harness.data.corpus import Embedded

        return Embedded().load().val.decode("utf-8", errors="replace")
    return Path(text).expanduser().read_text(encoding="utf-8")


# ---------------------------------------------------------------- the measurements


@torch.no_grad()
def loss_by_length(model, ids: torch.Tensor, length: int, stride: int, budget: int) -> float:
    """Nats per token over the first ``budget`` labels of ``ids`` (1-D), with windows of ``length`` tokens
    advancing ``stride``, each scoring the labels the previous one did not (harness/data/windows.py's rule)."""
    from harness.data.windows import window_starts

    labels = min(budget, len(ids) - 1)
    total, count = 0.0, 0
    for k, start in enumerate(window_starts(labels, length, stride)):
        window = ids[start : start + length + 1]
        logits = model(input_ids=window[None, :-1]).logits[0].double()  # (L, V)
        nll = torch.nn.functional.cross_entropy(logits, window[1:], reduction="none")  # (L,)
        new = nll[0 if k == 0 else length - stride:][: labels - start - (0 if k == 0 else length - stride)]
        total, count = total + float(new.sum()), count + len(new)
    return total / count


@torch.no_grad()
def passkey_retrieved(model, encode, filler: list[int], length: int, depth: float, key: int) -> bool | None:
    """Whether greedy decoding after a prompt of ``length`` tokens, the key at ``depth`` of the filler, gives the key
    (every key token the argmax given the ones before it); None: the needle and question do not fit in ``length``."""
    needle, question, answer = encode(NEEDLE.format(key=key)), encode(QUESTION), encode(str(key))
    room = length - len(needle) - len(question) - len(answer) + 1  # the last answer token is predicted, not input
    if room < 0:
        return None
    at = round(depth * room)
    prompt = filler[:at] + needle + filler[at:room] + question
    ids = torch.tensor(prompt + answer[:-1])[None]  # (1, ≤ L)
    predicted = model(input_ids=ids).logits[0, len(prompt) - 1 :].argmax(-1)  # (len(answer),)
    return predicted.tolist() == answer


def measure(model, encode, ids: torch.Tensor, spec: EvalSpec) -> dict[str, float]:
    """One cell's metrics: loss and perplexity by length, passkey accuracy by length and depth."""
    out: dict[str, float] = {}
    for length in spec.lengths:
        loss = loss_by_length(model, ids, length, spec.stride or max(1, length // 2), spec.budget)
        out[f"val/loss_at_{length}"], out[f"val/ppl_at_{length}"] = loss, math.exp(min(loss, 700.0))
    if spec.passkey_trials:
        filler = ids.tolist()
        g = torch.Generator().manual_seed(spec.seed)
        keys = torch.randint(10_000, 100_000, (spec.passkey_trials,), generator=g).tolist()
        for length in spec.lengths:
            hits = {d: [passkey_retrieved(model, encode, filler, length, d, key) for key in keys] for d in spec.depths}
            if any(h is None for trials in hits.values() for h in trials):
                continue  # the prompt does not fit: no figure rather than a wrong one
            for d, trials in hits.items():
                out[f"passkey/acc_at_{length}_depth_{d:g}"] = sum(trials) / len(trials)
            out[f"passkey/acc_at_{length}"] = sum(sum(t) for t in hits.values()) / sum(len(t) for t in hits.values())
    return out


# ---------------------------------------------------------------- the sweep, in MLflow


def run(spec: EvalSpec) -> tuple[str, dict[tuple[str, float], dict[str, float]]]:
    """Every cell as a child run of one parent run; returns (the parent's run id, metrics by cell)."""
    from harness.pretrained.rotary import apply_scaling
    from harness.record.run import TrackedRun
    from harness.record.store import resolve_tracking_uri

    model, encode = load(spec.model)
    ids = torch.tensor(encode(evaluation_text(spec.text))[: spec.budget + max(spec.lengths) + 1])
    if len(ids) < max(spec.lengths) + 1:
        raise ConfigError(f"--text={spec.text} holds {len(ids)} tokens, fewer than the longest length + 1")
    uri = resolve_tracking_uri(spec.tracking_uri)
    params = {"model": str(spec.model), "lengths": ",".join(map(str, spec.lengths)), "stride": str(spec.stride),
              "budget": str(spec.budget), "passkey_trials": str(spec.passkey_trials),
              "depths": ",".join(f"{d:g}" for d in spec.depths), "text": spec.text, "seed": str(spec.seed),
              "max_position_embeddings": str(model.config.max_position_embeddings)}
    parent = TrackedRun(uri, spec.experiment, f"hf-eval {spec.model.name}")
    results: dict[tuple[str, float], dict[str, float]] = {}
    with parent.open({"kind": "hf-eval"}, params):
        for method, factor in spec.cells():
            started = time.perf_counter()
            child = TrackedRun(uri, spec.experiment, f"{method} x{factor:g}",
                               {"mlflow.parentRunId": parent.run_id or "", "scaling": method, "factor": f"{factor:g}"})
            with child.open({"kind": "hf-eval-cell"}, {**params, "scaling": method, "factor": f"{factor:g}"}):
                apply_scaling(model, method=method, factor=factor)
                results[method, factor] = measure(model, encode, ids, spec)
                child.log_scalars({**results[method, factor], "seconds": time.perf_counter() - started}, 0)
            print(f"{method} x{factor:g}: " + ", ".join(f"{k}={v:.4g}" for k, v in results[method, factor].items()
                                                        if k.startswith("val/loss")))
        parent.log_files({"hf_eval.md": table(spec, results)})
    return parent.run_id or "", results


def table(spec: EvalSpec, results: dict[tuple[str, float], dict[str, float]]) -> str:
    """Perplexity (and passkey accuracy) by length, one row per cell: the report the parent run carries."""
    head = "| scaling | factor | " + " | ".join(f"ppl at {n}" for n in spec.lengths) + " | " + \
        " | ".join(f"passkey at {n}" for n in spec.lengths) + " |"
    rows = [head, "|" + "---|" * (2 + 2 * len(spec.lengths))]
    for (method, factor), m in results.items():
        ppl = [f"{m[f'val/ppl_at_{n}']:.3f}" for n in spec.lengths]
        key = [f"{m[f'passkey/acc_at_{n}']:.2f}" if f"passkey/acc_at_{n}" in m else "—" for n in spec.lengths]
        rows.append(f"| {method} | {factor:g} | " + " | ".join(ppl + key) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    import sys

    try:
        spec = parse(argv)
        if spec.check_only:
            print(f"ok: {len(spec.cells())} cells (scaling × factor) at lengths {', '.join(map(str, spec.lengths))} "
                  f"on {spec.model}; nothing loaded")
            return 0
        parent, results = run(spec)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(spec, results), end="")
    print(f"parent run {parent} in experiment {spec.experiment}")
    return 0
