"""One run, as a pipeline: check → build → open the record → fit → evaluate → close.

``check`` (harness/config/check.py) refuses a bad spec before anything is built or logged;
``build`` (harness/config/build.py) makes the model, the data and the Trainer; the run record
(``TrackedRun``, harness/record/run.py) is opened once and closed in its own ``finally``, FINISHED or
FAILED with the reason; the resume plan (harness/record/resume.py) holds the config's lock meanwhile.

May import: harness.config, harness.record, harness.model, harness.data, harness.scaleout, harness.pretrained, and the
ground.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import dataclass, replace

import torch

from harness import allocator, integrity
from harness.config.check import Checked, check
from harness.config.spec import Choices, RunSpec
from harness.data.corpus import Corpus, with_documents
from harness.errors import ConfigError
from harness.record.resume import plan_resume
from harness.record.run import WINDOWS_ARTIFACT, TrackedRun, flatten, git_sha
from harness.record.store import dashboard_command, dashboard_url
from harness.scaleout import job_ranks
from harness.signals import lightning_owns_sigterm, terminating


@dataclass
class Summary:
    run_id: str
    run_name: str
    tracking_uri: str
    experiment: str
    val_loss: float
    val_bpc: float | None
    step: int
    tokens_per_s: float | None  # None: this process trained no step
    n_params: int
    seconds: float
    order_gain: float  # val/order_gain at the last validation: nats/token lost when word order is shuffled
    min_order_gain: float  # report.min_order_gain: below it the model is "not yet using order"
    val_acc: float | None = None  # exact match, synthetic tasks
    experiment_id: str = ""
    order_signal: str = "scheme"  # where word order can come from (order_signal()); "none": it cannot


def train(spec: RunSpec, run: TrackedRun | None = None) -> Summary:
    """``run``: the record to write (a sweep cell passes one carrying its sweep tags); default a new one."""
    started = time.perf_counter()
    checked = check(spec)
    run = run or TrackedRun(checked.uri, spec.logger.experiment, run_name(spec.choices, spec.seed))
    plan = plan_resume(spec.values, checked.uri, spec.run.resume_mode)  # a bad resume= is refused here
    asked = checked.tokenizer.vocab_size
    corpus = _corpus(checked)
    _check_trained_vocabulary(spec, asked, checked.tokenizer.vocab_size)
    # lazy: Lightning takes seconds to import, and a refused config (above) must not pay for it
    from omegaconf import OmegaConf

    from harness.config.build import build
    from harness.model.module import Throughput
    from harness.record.callbacks import RunLogger, StepClock

    clock, throughput = StepClock(), Throughput(every=spec.trainer.log_every_n_steps)
    logger = RunLogger(run, clock)
    built = build(checked, corpus, plan.step, logger, [clock, throughput, *_callbacks(checked, plan, logger)])
    n_params = built.model.num_params()
    params = {
        **flatten(spec.values),
        "corpus.name": corpus.name,
        "corpus.bytes": str(corpus.size),
        "model.n_params": str(n_params),
        "tokenizer.trained_vocab_size": str(checked.tokenizer.vocab_size),
        **built.geometry.params(),
    }
    signal = order_signal(built.model.pos, checked.task.causal)
    tags = {**cell_tags(spec), "corpus_sha256": corpus.sha256, **plan.tags, "order_signal": signal}
    if checked.phases:
        from harness.model.phases import describe

        tags["phases"] = describe(list(checked.phases), spec.choices.pos)
    with terminating(), plan.session(built.owner), run.open(tags, params, reopen=plan.run_id, owner=built.owner):
        plan.link(run.run_id)
        run.log_files({"config.yaml": OmegaConf.to_yaml(spec.values)})
        final = fit(built, plan.ckpt)
        sums, tokens = built.module.val_windows.T.tolist()
        run.log_files(integrity.sealed_files({WINDOWS_ARTIFACT: json.dumps({"loss_sum": sums, "tokens": tokens})}))
        run.set_tags(_backend_tags(built.model))
        logger.flush()
        evaluate(built, checked, corpus, run, final["step"])
    return Summary(
        run.run_id or "",
        run.name,
        checked.uri,
        spec.logger.experiment,
        final["val/loss"],
        final.get("val/bpc"),
        final["step"],
        throughput.mean,
        n_params,
        time.perf_counter() - started,
        final["val/order_gain"],
        spec.report.min_order_gain,
        final.get("val/acc"),
        run.experiment_id if run.owner else "",
        signal,
    )


def _check_trained_vocabulary(spec: RunSpec, asked: int, trained: int) -> None:
    """The ids the fitted tokenizer has (``trained``): fewer than asked where the text allows no more merges (said,
    and the model sized to them); a paper's vocabulary (scale=paper) must be met, not only configured."""
    paper = (spec.run.paper or {}).get("vocab_size")
    if paper and int(paper) != trained:
        raise ConfigError(
            f"this scale=paper setting is the paper's model with {int(paper):,} token ids, and this "
            f"corpus trains {trained:,}: give the paper's data (README, 'The same presets at "
            "scale=paper'), or ~paper to train this substitute on purpose"
        )
    if trained < asked:
        print(
            f"tokenizer: the training split gives {trained:,} ids of tokenizer.vocab_size={asked:,} (no more merges "
            f"occur in it); the model has {trained:,} embedding rows",
            file=sys.stderr,
        )


def _corpus(checked: Checked) -> Corpus:
    """The run's corpus, with document ids where positions restart or attention stops at documents, and the
    tokenizer fitted to it (a subword vocabulary: trained on the training split, or loaded from its cache)."""
    corpus = checked.source.load()
    if checked.documents:  # model.restart_positions / document_mask on a text task: windows carry document_ids
        corpus = with_documents(corpus, checked.source)
    checked.tokenizer.fit(corpus)
    return corpus


def _callbacks(checked: Checked, plan, logger) -> list:
    """Progress (a bar in a terminal, else lines), checkpoints for resuming, and positional phases."""
    from harness.model.progress import progress_callbacks
    from harness.record.callbacks import CommittedCheckpoints, RngState

    spec = checked.spec
    callbacks = [
        *progress_callbacks(spec.progress.mode, spec.progress.every_n_steps, spec.trainer.enable_progress_bar),
        RngState(),
        CommittedCheckpoints(plan.dir, plan.every, logger.flush, plan.step),
    ]
    if checked.phases:  # positional phases (harness/model/phases.py): before each step's forward
        from harness.model.phases import PositionPhases

        callbacks.append(PositionPhases(list(checked.phases)))
    return callbacks


def _backend_tags(model) -> dict[str, str]:
    """``attn_backend``: the kernel(s) the attention actually ran (attn.backend=auto picks at the first
    step; ``backend_used`` of attention/softmax.py), so timings compare like with like."""
    used = sorted({m.backend_used for m in model.modules() if getattr(m, "backend_used", None)})
    return {"attn_backend": ",".join(used)} if used else {}


def fit(built, ckpt) -> dict:
    """Train to max_steps; the last entry of the validation results is the final model's."""
    trainer, module = built.trainer, built.module
    with job_ranks(trainer, ckpt), lightning_owns_sigterm():  # a SIGTERM ends the step, then stops (harness/signals.py)
        trainer.fit(module, built.train_loader, built.val_loader, ckpt_path=ckpt)
        if not module.val_results or module.val_results[-1]["step"] != trainer.global_step:
            trainer.validate(module, built.val_loader, verbose=False)  # the summary reports the final model
    return module.val_results[-1]


def evaluate(built, checked: Checked, corpus, run: TrackedRun, step: int) -> None:
    """What the final model is scored on beyond the validation split, and the scheme's own files.
    Rank 0 only scores: the other ranks need not."""
    from harness.data.tasks.base import ScoredTask
    from harness.model import evaluate as ev  # lazy: as in train()

    spec = checked.spec
    task, lengths = checked.task, spec.eval.lengths
    if built.owner and isinstance(task, ScoredTask) and task.scores_sequences:
        scored = ev.evaluate_task(built.module, task, corpus, spec.data.batch_size)
        run.log_scalars(ev.task_metrics(scored), step)
        print(ev.accuracy_table(scored))
        run.set_tags({f"eval_skipped_at_{n}": reason[:1000] for n, reason in scored.skipped.items()})
        run.log_files(task.artifacts(scored))  # the task's own files (harness/data/tasks/base.py)
        parts, tables = ev.evaluate_parts(built.module, task, corpus, spec.data.batch_size)  # task=mixture
        run.log_scalars(parts, step)
        if tables:
            print(tables)
    elif built.owner and lengths:
        from harness.model.extrapolation import evaluate_extrapolation  # lazy: matplotlib

        by_length = evaluate_extrapolation(
            built.module,
            corpus,
            checked.tokenizer,
            task,
            # data.eval_batches is per device: rank 0 scores the budget of every rank's validation shard
            replace(
                spec.data, eval_batches=spec.data.eval_batches and spec.data.eval_batches * built.geometry.world_size
            ),
            spec.eval,
            spec.seed,
            built.geometry.world_size,
        )
        run.log_scalars(by_length.metrics(built.module.bytes_per_token), step)
        run.set_tags({f"eval_skipped_at_{n}": reason[:1000] for n, reason in by_length.skipped.items()})
        run.log_files(by_length.files(spec.eval.position_buckets))
    run.log_files(integrity.sealed_files(built.model.pos.artifacts()))  # theta.csv, read back by results/theta.py
    run.log_files(_rope_parameters_file(built.model))
    if spec.run.export == "hf" and built.owner:  # AutoModelForCausalLM.from_pretrained(<artifacts>/hf_model)
        from harness.pretrained.export import hf_files

        run.log_files(
            hf_files(
                built.model,
                checked.tokenizer.vocab_size,
                built.model.pos.shape.max_len,
                task.causal,
                checked.tokenizer,
            ),
            "hf_model",
        )
    if spec.run.diagnostics and built.owner:  # attention pictures of the final model: harness/model/diagnostics.py
        from harness.model.diagnostics import attention_diagnostics

        val = built.val_loader  # read in order, not rank 0's DDP shard; its batches are (plain, shuffled) pairs
        diagnostics = attention_diagnostics(
            built.model,
            (
                pair["plain"]
                for pair in torch.utils.data.DataLoader(val.dataset, val.batch_size, collate_fn=val.collate_fn)
            ),
        )
        run.log_scalars(diagnostics.metrics(), step)
        run.log_files(diagnostics.files(), "diagnostics")


def _rope_parameters_file(model) -> dict[str, str]:
    """``rope_parameters.json``: the trained model's RoPE as transformers v5 states it, with its layer types
    (harness/pretrained/rope_parameters.py); nothing for a model that format cannot hold (ALiBi, Performer, …)."""
    from harness.pretrained.rope_parameters import write

    try:
        params, types = write(model.layers())
    except ConfigError:
        return {}
    return {"rope_parameters.json": json.dumps({"rope_parameters": params, "layer_types": types}, indent=2) + "\n"}


def order_signal(scheme, causal: bool) -> str:
    """Where the model can learn word order from: its positional scheme, only the causal mask (NoPE,
    Kazemnejad et al. 2023), or nowhere (NoPE, bidirectional: permutation-equivariant, so its order gain
    is 0 by construction and "not yet using order" does not apply)."""
    return "scheme" if scheme.hooks() else ("causal mask" if causal else "none")


def run_name(choices: Choices, seed: int) -> str:
    name = f"pos={choices.pos} attn={choices.attn} seed={seed}"
    return name if choices.task == "mlm" else f"{name} task={choices.task}"


def cell_tags(spec: RunSpec) -> dict[str, str]:
    """The grid coordinates every run carries, known before anything is built."""
    c = spec.choices
    return {
        "pos": c.pos,
        "attn": c.attn,
        "task": c.task,
        "data": c.data,
        "seed": str(spec.seed),
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "malloc": allocator.setting(),
    }


def format_summary(s: Summary) -> str:
    bpc = f"{s.val_bpc:.3f}" if s.val_bpc is not None else "n/a (no text: a synthetic task)"
    tps = f"{s.tokens_per_s:,.0f}" if s.tokens_per_s is not None else "n/a (no training step in this process)"
    using = (
        "cannot use word order (no positional scheme, bidirectional): 0 by construction"
        if s.order_signal == "none"
        else "uses word order"
        if s.order_gain >= s.min_order_gain
        else f"NOT yet using word order (below report.min_order_gain={s.min_order_gain}): train longer"
    )
    acc = [] if s.val_acc is None else [f"  val accuracy     {s.val_acc:.3f} (exact match, in-distribution lengths)"]
    return "\n".join(
        [
            "",
            f"posbench · {s.run_name} · {s.n_params / 1e6:.2f}M params · {s.seconds:.0f} s",
            f"  final val loss   {s.val_loss:.4f} nats/token (step {s.step})",
            *acc,
            f"  order gain       {s.order_gain:+.4f} nats/token when word order is shuffled: {using}",
            f"  val bits/byte    {bpc}",
            f"  train tokens/s   {tps}",
            f"  MLflow run       {s.run_id} (experiment '{s.experiment}')",
            f"  dashboard        {dashboard_command(s.tracking_uri)}",
            f"  this run         {dashboard_url(s.experiment_id, s.run_id)}",
            "",
        ]
    )
