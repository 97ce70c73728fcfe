"""Assembly: build every object from the config, train, evaluate, log, summarise."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig, OmegaConf

from harness.errors import ConfigError


def instantiate(node, **kwargs):
    """hydra.utils.instantiate, but a ConfigError raised by a constructor stays a ConfigError
    (Hydra wraps it in an InstantiationException, which would hide the one-line message)."""
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


@dataclass
class DataConfig:
    """conf/config.yaml ``data`` loader keys (the corpus itself is ``data.source``)."""

    seq_len: int = 128
    batch_size: int = 32
    eval_batches: int | None = None  # None: the whole validation split

    def __post_init__(self):
        for key in ("seq_len", "batch_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a positive integer")
        if self.eval_batches is not None and self.eval_batches <= 0:
            raise ConfigError(f"data.eval_batches={self.eval_batches} must be positive, or null for all")


@dataclass
class Summary:
    run_id: str
    run_name: str
    tracking_uri: str
    experiment: str
    val_loss: float
    val_bpc: float | None
    step: int
    tokens_per_s: float
    n_params: int
    seconds: float


def run_name(choices: dict[str, str], seed: int) -> str:
    name = f"pos={choices['pos']} attn={choices['attn']} seed={seed}"
    return name if choices["task"] == "mlm" else f"{name} task={choices['task']}"


def cell_tags(cfg: DictConfig, choices: dict[str, str]) -> dict[str, str]:
    """The grid coordinates every run carries, known before anything is built."""
    import platform

    import torch

    from harness.record.tracking import git_sha

    return {"pos": choices["pos"], "attn": choices["attn"], "task": choices["task"], "data": choices["data"],
            "seed": str(cfg.seed), "git_sha": git_sha(), "python": platform.python_version(),
            "torch": torch.__version__}


def train(cfg: DictConfig, choices: dict[str, str], extra_tags: dict[str, str] | None = None) -> Summary:
    """``choices``: the config-group option names (pos, attn, task, data), for names and tags.
    ``extra_tags``: added to the run's tags (a sweep passes its parent run id and sweep id)."""
    import lightning as L

    from harness.config.validate import preflight
    from harness.data.corpus import Corpus
    from harness.data.windows import make_loaders
    from harness.scaleout import Scale, check_trainer, job_ranks, rank_zero_run
    from harness.model.evaluate import evaluate_lengths, log_lengths, requested_lengths
    from harness.model.transformer import Transformer
    from harness.model.module import LanguageModel, Throughput
    from harness.record.resume import plan_resume
    from harness.record.tracking import MlflowTracker, flatten, mlflow_run, resolve_tracking_uri

    started = time.perf_counter()
    uri = resolve_tracking_uri(cfg.logger.tracking_uri)
    preflight(cfg, uri)
    L.seed_everything(cfg.seed, verbose=False)
    data = DataConfig(**{k: v for k, v in cfg.data.items() if k in DataConfig.__dataclass_fields__})
    _check_optim(cfg)
    check_trainer(cfg.trainer)
    lengths = requested_lengths(cfg)
    tokenizer = instantiate(cfg.tokenizer)
    objective = instantiate(cfg.task, tokenizer=tokenizer)
    model = Transformer(instantiate(cfg.model), tokenizer.vocab_size, data.seq_len, objective.causal,
                        pos=instantiate(cfg.pos), attn=instantiate(cfg.attn))
    if model.cfg.compile:
        model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model
    corpus: Corpus = instantiate(cfg.data.source).load()
    resume = plan_resume(cfg, uri)  # a bad resume= is refused here, before any run exists
    # built first: its world size sizes the data, its rank decides who talks to MLflow
    throughput = Throughput(every=cfg.trainer.log_every_n_steps)
    tracker = MlflowTracker(None, "")  # attached to the run below (rank 0); its methods are rank-0 only
    trainer = instantiate(cfg.trainer, logger=tracker, callbacks=[throughput, *resume.callbacks(tracker)])
    tracker.step_of = lambda: trainer.global_step
    scale = Scale.of(trainer, data.batch_size, cfg.optim.optimizer.lr)
    train_dl, val_dl = make_loaders(corpus, tokenizer, objective, data.seq_len, data.batch_size,
                                    n_train=scale.train_examples(cfg.trainer.max_steps), seed=cfg.seed,
                                    eval_batches=data.eval_batches, world_size=scale.world_size,
                                    rank=trainer.global_rank,
                                    start=resume.first_example(scale.effective_batch))
    module = LanguageModel(model, instantiate(cfg.optim.optimizer), instantiate(cfg.optim.schedule),
                           byte_level=tokenizer.byte_level)

    name = run_name(choices, cfg.seed)
    tags = {**cell_tags(cfg, choices), "corpus_sha256": corpus.sha256, **resume.tags, **(extra_tags or {})}
    resolved = OmegaConf.to_container(cfg, resolve=True)
    params = {**flatten(resolved), "corpus.name": corpus.name, "corpus.bytes": str(corpus.size),
              "model.n_params": str(model.num_params()), **scale.params()}
    with resume.session(trainer.is_global_zero), rank_zero_run(
            trainer, mlflow_run, uri, cfg.logger.experiment, name, tags, params, resume.run_id) as (client, run_id):
        resume.attach(tracker, client, run_id)  # run id beside the checkpoints; the logger writes to it
        _log_config(client, run_id, cfg)
        with job_ranks(trainer):
            trainer.fit(module, train_dl, val_dl, ckpt_path=resume.ckpt)
            if not module.val_results or module.val_results[-1]["step"] != trainer.global_step:
                trainer.validate(module, val_dl, verbose=False)  # the summary always reports the final model
        final = module.val_results[-1]
        tracker.flush()
        if lengths and trainer.is_global_zero:  # logged by rank 0 only: the other ranks need not score
            log_lengths(client, run_id, final["step"], tokenizer.byte_level,
                        evaluate_lengths(module, corpus, tokenizer, objective, data, lengths))
        _log_texts(client, run_id, model.pos.artifacts())
    return Summary(run_id, name, uri, cfg.logger.experiment, final["val/loss"], final.get("val/bpc"),
                   final["step"], throughput.mean, model.num_params(), time.perf_counter() - started)


def _check_optim(cfg: DictConfig) -> None:
    if cfg.optim.optimizer.lr <= 0:
        raise ConfigError(f"optim.optimizer.lr={cfg.optim.optimizer.lr} must be positive")
    if cfg.trainer.max_steps <= 0:
        raise ConfigError(f"trainer.max_steps={cfg.trainer.max_steps} must be a positive integer")


def _log_config(client, run_id: str, cfg: DictConfig) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
        client.log_artifact(run_id, str(path))


def _log_texts(client, run_id: str, files: dict[str, str]) -> None:
    if not files:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        client.log_artifacts(run_id, tmp)


def format_summary(s: Summary) -> str:
    from harness.record.tracking import dashboard_command

    bpc = f"{s.val_bpc:.3f}" if s.val_bpc is not None else "n/a (not byte-level)"
    return "\n".join([
        "",
        f"posbench · {s.run_name} · {s.n_params / 1e6:.2f}M params · {s.seconds:.0f} s",
        f"  final val loss   {s.val_loss:.4f} nats/token (step {s.step})",
        f"  val bits/byte    {bpc}",
        f"  train tokens/s   {s.tokens_per_s:,.0f}",
        f"  MLflow run       {s.run_id} (experiment '{s.experiment}')",
        f"  dashboard        {dashboard_command(s.tracking_uri)}",
        "",
    ])
