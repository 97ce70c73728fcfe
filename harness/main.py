"""The ``posbench`` command (and ``python run.py``): subcommands, then Hydra's entry over conf/ for the ones that
compose a run.

    posbench run [-m] [overrides]             train one run, or a sweep with -m (python run.py [-m] …)
    posbench check [--gpu-memory SIZE] [-m] [overrides]
                                              validate without training (python run.py --check …)
    posbench list [--md] [overrides]          every pos/attn/task option (python run.py --list)
    posbench matrix [--md] [overrides]        which pos × attn pairings train (python run.py --matrix)
    posbench report|paper|tune|index …        a sweep's report, a paper preset's verdict, tuned rates, the
                                              results index (python -m results …)
    posbench bench [gpu|loader|attention|seeds] …   the benchmarks (python -m harness.bench[.…] …)
    posbench prepare DIR [overrides]          pre-tokenized shards (harness/data/prepare.py)
    posbench hf-rope CONFIG                   the overrides that build a transformers model's RoPE per layer
                                              (its config.json's rope_parameters, flat or per layer type)
    posbench hf-eval MODEL_DIR [--scalings …]  a pretrained causal LM under each RoPE scaling × factor: perplexity
                                              by length, passkey by depth (harness/pretrained/hf_eval.py)

Without a subcommand the arguments are ``python run.py``'s (overrides, ``-m``, ``--check``, ``--matrix``,
``--list``), so every older command line keeps working. conf/ is found beside this package (harness/paths.py),
so an installed copy composes from any working directory.

May import: harness.cli, harness.config, harness.train, harness.sweep, harness.scaleout, harness.record,
harness.bench, harness.data, harness.pretrained, results (the commands it dispatches to,
each imported only when named), and the ground.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from omegaconf import DictConfig

from harness import cli
from harness.allocator import keep_freed_memory
from harness.config.load import from_job, load
from harness.errors import (
    ConfigError,
    Diverged,
    OneLineParser,
    StoreDamaged,
    damaged_store_line,
    one_line,
    said_refusal,
    said_write_failure,
    store_damage,
)
from harness.paths import CONF
from harness.signals import exit_if_orphaned, stop_when_orphaned


def job(cfg: DictConfig) -> float | None:
    """The body of the training app's job: a single run, or one cell of a sweep (which never raises: its
    failure is recorded on its run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from harness.scaleout import rank_zero_print  # lazy from here: training imports take seconds

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        spec = from_job(cfg, multirun)
        if multirun:  # a cell never raises: its failure is on its run
            from harness.sweep.callback import job_sweep_tags
            from harness.sweep.cell import train_cell

            stop_when_orphaned()
            try:
                return train_cell(spec, job_sweep_tags())
            finally:  # a stopped cell raises its stop
                exit_if_orphaned()
        from harness.train import format_summary, train

        summary = train(spec)
    except ConfigError as e:  # here, not in run_app: Hydra would log "Error executing job" first
        sys.exit(said_refusal(e))
    except Diverged as e:  # the run is closed FAILED (failure=diverged); an outcome, not a crash: no traceback
        print(f"error: {one_line(e)}; the run is closed FAILED", file=sys.stderr)
        sys.exit(1)
    except StoreDamaged as e:  # found when the run closed (harness/record/run.py)
        print(e, file=sys.stderr)
        sys.exit(1)
    except Exception as e:
        damaged = store_damage(e)  # sqlite's own error, mid-run: its result code, under MLflow's exception
        if damaged:
            from harness.record.store import resolve_tracking_uri

            print(damaged_store_line(resolve_tracking_uri(spec.logger.tracking_uri), damaged), file=sys.stderr)
        elif not said_write_failure(
            e,
            "free space (or raise the limit) and run the same command plus resume=true: "
            "the run is closed FAILED where the store could still be written",
        ):
            raise
        sys.exit(1)
    rank_zero_print(format_summary(summary))  # DDP: every rank gets here; rank 0 speaks
    return summary.val_loss


# Hydra's entry over conf/, run only to train; a launcher's workers (joblib, submitit) import ``job`` by name
train_app = hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")(job)


def main() -> int:
    """``posbench`` / ``python run.py`` with ``sys.argv``: exit status 0, or 2 after one line for a user's mistake."""
    try:
        keep_freed_memory()  # freed tensors reused by the next step, not page-faulted in again (harness/allocator.py)
    except ConfigError as e:
        return said_refusal(e)
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command in ("help", "-h", "--help") and len(sys.argv) == 2:
        print(__doc__.split("\n\n")[1])
        return 0
    if command in COMMANDS:
        return COMMANDS[command](sys.argv[2:])
    if command and command.isidentifier():  # a bare word is no override (those are key=value, +key=, ~key)
        near = difflib.get_close_matches(command, COMMANDS, n=1)
        return said_refusal(
            f"{command!r} is no posbench command{f'; did you mean {near[0]}?' if near else ''} (commands: "
            f"{', '.join(COMMANDS)}; or key=value overrides, as python run.py takes)"
        )
    return _run(sys.argv[1:])


def _run(rest: list[str]) -> int:
    return cli.run_command(rest, train_app)


def _flagged(flag: str) -> Callable[[list[str]], int]:
    """``check`` is ``--check``; ``list`` and ``matrix`` are ``--list`` and ``--matrix`` (``--md``: a markdown
    table)."""

    def run(rest: list[str]) -> int:
        md = flag != cli.CHECK_FLAG and "--md" in rest
        return _run([f"{flag}=md" if md else flag, *(a for a in rest if not (md and a == "--md"))])

    return run


def _results(command: str) -> Callable[[list[str]], int]:
    def run(rest: list[str]) -> int:
        from results.__main__ import main as results_main

        return results_main([command, *rest])

    return run


def _bench(rest: list[str]) -> int:
    """``posbench bench [gpu|loader|attention|seeds] …``: harness.bench's grid when no part is named."""
    from harness.bench import attention, gpu, loader, seeds
    from harness.bench.cli import main as grid

    parts = {"gpu": gpu, "loader": loader, "attention": attention, "seeds": seeds}
    if rest and rest[0] in parts:
        return parts[rest[0]].main(rest[1:])
    return grid(rest)


def prepare_shards(
    out: str | Path, overrides: list[str], shard_tokens: int | None = None, block_bytes: int | None = None
) -> dict:
    """The shards of the data source and tokenizer ``overrides`` pick, loaded and checked as for a run
    (harness/config/load.py), written by harness/data/prepare.py; the manifest."""
    from harness.data import prepare

    shard_tokens = prepare.SHARD_TOKENS if shard_tokens is None else shard_tokens
    if shard_tokens <= 0:  # before the overrides are loaded: the option's own mistake first
        raise ConfigError(f"--shard-tokens={shard_tokens} must be a positive number of token ids")
    spec = load(overrides)
    return prepare.prepare(
        out,
        spec.source.build(),
        spec.tokenizer.build(),
        shard_tokens,
        prepare.BLOCK_BYTES if block_bytes is None else block_bytes,
    )


def _prepare(rest: list[str]) -> int:
    """``posbench prepare DIR [overrides] [--shard-tokens N]``: one line for a mistake, nothing left on a failure
    or a stop (the shards written so far are removed)."""
    from harness.config.hydra_errors import user_error
    from harness.signals import exit_code, terminating

    parser = OneLineParser(prog="posbench prepare", description="Tokenize a corpus once into memory-mapped shards")
    parser.add_argument("out", help="the folder to write (new, or without a manifest.json)")
    parser.add_argument("overrides", nargs="*", help="data=... tokenizer=... as for a run")
    parser.add_argument("--shard-tokens", type=int, help="token ids per shard file")
    try:
        args = parser.parse_args(rest)
    except ConfigError as e:  # a usage mistake (OneLineParser)
        return said_refusal(e)
    try:
        with terminating():  # SIGTERM raises Stopped(143) here: prepare removes what it wrote, then the exit
            manifest = prepare_shards(args.out, args.overrides, args.shard_tokens)
    except (KeyboardInterrupt, SystemExit) as e:
        code = exit_code(e)
        if code is None:
            raise
        print(f"stopped: nothing was left in {args.out}", file=sys.stderr)
        return code
    except Exception as e:
        message = user_error(e, rest)
        if message is not None:
            return said_refusal(message)
        if not said_write_failure(
            e, f"nothing was left in {args.out}: free space (or raise the limit) and run prepare again"
        ):
            raise
        return 1
    splits = manifest["splits"]
    print(
        f"{args.out}: {splits['train']['tokens']:,} train + {splits['val']['tokens']:,} val tokens "
        f"({manifest['dtype']}, tokenizer={manifest['tokenizer']['config']}), from {manifest['corpus']['bytes']:,} "
        f"bytes of {manifest['corpus']['name']}"
    )
    return 0


def _hf_rope(rest: list[str]) -> int:
    """``posbench hf-rope CONFIG``: the overrides for ``posbench run $(posbench hf-rope CONFIG)`` (harness/pretrained/
    rope_parameters.py): no spaces inside one, and Hydra's own quotes as they are (a ``$(…)`` removes no quote)."""
    from harness.pretrained.rope_parameters import read_config

    try:
        if len(rest) != 1 or rest[0].startswith("-"):
            raise ConfigError("posbench hf-rope takes one argument, a transformers config.json or its folder")
        layers = read_config(rest[0])
    except ConfigError as e:
        return said_refusal(e)
    print(" ".join(layers.overrides()))
    return 0


def _hf_eval(rest: list[str]) -> int:
    from harness.pretrained.hf_eval import main as hf_eval_main

    return hf_eval_main(rest)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run,
    "check": _flagged(cli.CHECK_FLAG),
    "list": _flagged(cli.LIST_FLAG),
    "matrix": _flagged(cli.MATRIX_FLAG),
    "report": _results("report"),
    "paper": _results("paper"),
    "tune": _results("tune"),
    "index": _results("index"),
    "bench": _bench,
    "prepare": _prepare,
    "hf-rope": _hf_rope,
    "hf-eval": _hf_eval,
}


if __name__ == "__main__":  # python -m harness.main: the DDP ranks of an installed copy (harness/scaleout.py)
    sys.exit(main())
