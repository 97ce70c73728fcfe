"""The bad-input table: every kind of mistake a user can make at each entry point, the line its refusal must
contain, the prepared inputs the rows name (``{files}``), and how a row is turned into a command
(``row_request``). Plain module: tests/unit/test_bad_input.py runs every row in-process, and
tests/process/test_bad_input_process.py runs a sample (and what only a process shows) as real commands.

The table holds every kind the README names (values of the wrong type or range in each config group, keys
that do not exist, tracking stores MLflow cannot open, resources that cannot fit, bad data paths, resume
mistakes, Hydra's own syntax errors, and the other commands' bad arguments).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import zipfile
from pathlib import Path

from tests.helpers import HANG, ROOT, TINY

QUICK = [*TINY, "trainer.max_steps=2"]


def listed(group: str) -> str:
    """How the error lists a group's options: every conf/<group>/*.yaml, in name order."""
    return ", ".join(sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml")))


# (id, overrides — "{files}" is a directory of prepared inputs, see `files` —, text the line must contain)
RUN_CASES = [
    # ---- the common mistakes: options, shapes, ranges, data paths, tracking stores, resume
    ("unknown-pos", ["pos=foo"], f"Could not find 'pos/foo'; use one of pos={listed('pos')}"),
    ("unknown-attn", ["attn=foo"], f"Could not find 'attn/foo'; use one of attn={listed('attn')}"),
    ("unknown-task", ["task=foo"], f"use one of task={listed('task')}"),
    ("unknown-key", ["model.foo=1"], "Could not override 'model.foo'"),
    ("override-syntax", ["model.d_model=["], "cannot parse override 'model.d_model=['"),
    ("heads-divide-d_model", ["model.n_heads=3"], "not divisible by model.n_heads=3; change one"),
    ("odd-rope-head-dim", ["model.d_model=6"], "1.0 × 3 is not a positive even integer"),
    ("window-over-length", ["attn=local", "attn.window=64"], "attn.window=64 exceeds the longest sequence (32 tokens"),
    ("window-zero", ["attn=local", "attn.window=0"], "attn.window=0 must be a positive integer"),
    ("window-negative", ["attn=local", "attn.window=-4"], "attn.window=-4 must be a positive integer"),
    ("lr-negative", ["optim.optimizer.lr=-1"], "optim.optimizer.lr=-1 must be positive"),
    ("lr-zero", ["optim.optimizer.lr=0"], "optim.optimizer.lr=0 must be positive"),
    (
        "cpu-devices-all",
        ["trainer.devices=-1"],
        "trainer.devices=-1 with trainer.accelerator=cpu: CPU processes are counted",
    ),  # check passed it; Lightning refused it when the run built its Trainer
    ("cpu-devices-ids", ["trainer.devices=[0,1]"], "with trainer.accelerator=cpu: CPU processes are counted"),
    (
        "fire-init-beyond-float32",
        ["task=clm", "pos=fire", "pos.init_c=1e300"],
        "pos.init_c=1e+300 must be within float32's range",
    ),  # check (on meta) passed it; the run's real construction raised torch's overflow
    (
        "dd-alibi-bias-beyond-float32",
        ["task=clm", "pos=dd_alibi", "pos.bias_init=1e300"],
        "pos.bias_init=1e+300 must be within float32's range",
    ),
    (
        "lr-overflows-the-step",
        ["optim.optimizer.lr=1e300"],
        "optim.optimizer.lr=1e+300 is beyond 1e+30: the optimizer's step computes in float32",
    ),  # check passed it; the run's first step raised torch's overflow
    ("weight-decay-overflows-the-step", ["optim.optimizer.weight_decay=1e31"], "weight_decay=1e+31 is beyond 1e+30"),
    ("steps-zero", ["trainer.max_steps=0"], "trainer.max_steps=0 must be a positive integer"),
    ("steps-not-a-number", ["trainer.max_steps=abc"], "trainer.max_steps='abc' must be an integer"),
    ("batch-zero", ["data.batch_size=0"], "data.batch_size=0 must be a positive integer"),
    ("batch-negative", ["data.batch_size=-8"], "data.batch_size=-8 must be a positive integer"),
    ("workers-negative", ["data.num_workers=-1"], "data.num_workers=-1 must be ≥ 0"),
    ("workers-unbounded", ["data.num_workers=1000000"], "data.num_workers=1000000 exceeds"),
    ("seq-len-zero", ["data.seq_len=0"], "data.seq_len=0 must be a positive integer"),
    ("seed-not-a-number", ["seed=abc"], "seed='abc' must be an integer"),
    ("mask-prob-zero", ["task.mask_prob=0"], "task.mask_prob=0 must lie in (0, 1)"),
    ("mask-prob-over-one", ["task.mask_prob=1.5"], "task.mask_prob=1.5 must lie in (0, 1)"),
    ("dropout-over-one", ["model.dropout=1.5"], "model.dropout=1.5 must lie in [0, 1)"),
    ("unknown-decay", ["optim.schedule.decay=foo"], "use cosine, linear or constant"),
    ("t5-odd-buckets", ["pos=t5", "pos.num_buckets=5"], "pos.num_buckets=5 must be even"),
    ("unknown-backend", ["attn.backend=foo"], "attn.backend='foo' is unknown"),
    ("eval-batches-zero", ["data.eval_batches=0"], "data.eval_batches=0 must be positive"),
    ("eval-lengths-negative", ["eval.lengths=[128,-5]"], "[-5] are not positive integers"),
    ("eval-lengths-not-numbers", ["eval.lengths=[abc]"], "['abc'] are not positive integers"),
    ("incompatible-pairing", ["pos=xl", "attn=local"], "incompatible pairing: attn=local cannot apply a content"),
    ("causal-only-scheme-mlm", ["pos=fox"], "incompatible pairing: pos=fox with a bidirectional task: FoX's forget"),
    (
        "documents-xl-restart",
        ["pos=xl", "model.restart_positions=true"],
        "incompatible pairing: model.restart_positions=true with pos=xl: rel_shift",
    ),
    (
        "documents-mask-performer",
        ["attn=performer", "model.document_mask=true"],
        "incompatible pairing: model.document_mask=true with attn=performer",
    ),
    (
        "documents-randomized",
        ["pos.randomize=true", "pos.max_position=64", "model.restart_positions=true"],
        "randomized positions are drawn once per window, not per document",
    ),
    (
        "documents-subword",
        ["tokenizer=bpe", "model.document_mask=true"],
        "model.document_mask=true maps document starts from bytes to tokens one to one",
    ),
    ("documents-not-a-bool", ["model.restart_positions=maybe"], "model.restart_positions"),
    ("text-without-path", ["data=text"], "data=text needs a file or directory: add data.path="),
    ("missing-corpus", ["data=text", "data.path={files}/nope.txt"], "does not exist; point it at a UTF-8 text"),
    ("empty-corpus", ["data=text", "data.path={files}/empty.txt"], "holds 0 bytes; give at least 4 KiB"),
    ("non-utf8-corpus", ["data=text", "data.path={files}/latin1.txt"], "is not UTF-8 (bad byte at offset"),
    (
        "window-longer-than-corpus",
        ["data=text", "data.path={files}/small.txt", "data.seq_len=8192", "model.n_heads=2"],
        "not more than one window of 8192; lower data.seq_len",
    ),
    ("no-validation-split", ["data=text", "data.path={files}/small.txt"], "the validation split has 0 tokens"),
    ("enwik8-wrong-size", ["data=enwik8", "data.path={files}/small.txt"], "holds 7,000 bytes, enwik8 holds 100,000,"),
    ("enwik8-wrong-checksum", ["data=enwik8", "data.path={files}/zeros"], "is not enwik8 (sha256"),
    (
        "enwik8-missing-no-download",
        ["data=enwik8", "data.path={files}/nope", "data.download=false"],
        "not found; set data.path=/path/to/enwik8 or data.download=true",
    ),
    ("tracking-uri-relative", ["logger.tracking_uri=sqlite:///rel.db"], "is not sqlite:////absolute/path.db"),
    ("tracking-uri-scheme", ["logger.tracking_uri=foo://bar"], "has scheme 'foo', which MLflow cannot open"),
    ("tracking-uri-no-host", ["logger.tracking_uri=http://"], "names no host"),
    (
        "store-dir-unwritable",
        ["logger.tracking_uri=sqlite:///{files}/empty.txt/mlflow.db"],
        "logger.tracking_uri: cannot create",
    ),
    ("output-dir-unwritable", ["hydra.run.dir={files}/empty.txt/run"], "cannot write"),
    ("checkpoint-dir-unwritable", ["checkpoint.dir={files}/empty.txt/ckpt"], "checkpoint.dir: cannot create"),
    ("checkpoint-every-negative", ["checkpoint.every_n_steps=-1"], "checkpoint.every_n_steps=-1 must be"),
    ("resume-without-checkpoint", ["resume=true"], "resume=true: no checkpoint for this config"),
    ("resume-missing-file", ["resume={files}/step-4.ckpt"], "no such checkpoint; use resume=true"),
    ("resume-foreign-checkpoint", ["resume={files}/foreign/step-4.ckpt"], "was written by another config"),
    ("resume-corrupt-checkpoint", ["resume={files}/corrupt/step-4.ckpt"], "step-4.ckpt is corrupt or truncated ("),
    ("resume-unlinked-checkpoint", ["resume={files}/unlinked/step-4.ckpt"], "no run.json beside it, so which"),
    ("resume-bad-value", ["resume=maybe"], "resume='maybe': use resume=true, resume=auto"),
    # ---- values of the wrong type or range, in every group
    ("lr-not-a-number", ["optim.optimizer.lr=abc"], "optim.optimizer.lr='abc' must be a number"),
    ("lr-nan", ["optim.optimizer.lr=nan"], "optim.optimizer.lr=nan must be a finite number"),
    ("lr-inf", ["optim.optimizer.lr=inf"], "optim.optimizer.lr=inf must be a finite number"),
    ("betas-out-of-range", ["optim.optimizer.betas=[1.5,0.9]"], "betas=[1.5, 0.9] must be two numbers in [0, 1)"),
    ("betas-not-a-list", ["optim.optimizer.betas=abc"], "optim.optimizer.betas='abc' must be a list of numbers"),
    ("weight-decay-negative", ["optim.optimizer.weight_decay=-1"], "optim.optimizer.weight_decay=-1 must be ≥ 0"),
    ("eps-negative", ["+optim.optimizer.eps=-1"], "optim.optimizer.eps=-1 must be positive"),
    ("amsgrad-not-a-bool", ["+optim.optimizer.amsgrad=maybe"], "optim.optimizer.amsgrad='maybe' must be true or false"),
    ("warmup-negative", ["optim.schedule.warmup_steps=-1"], "optim.schedule.warmup_steps=-1 must be ≥ 0"),
    ("warmup-not-a-number", ["optim.schedule.warmup_steps=abc"], "warmup_steps='abc' must be an integer"),
    ("min-lr-ratio-over-one", ["optim.schedule.min_lr_ratio=2"], "optim.schedule.min_lr_ratio=2 must lie in [0, 1]"),
    ("seed-negative", ["seed=-1"], "seed=-1 must lie in [0, 2^32 − 1]"),
    ("seed-fraction", ["seed=1.5"], "seed=1.5 must be an integer"),
    (
        "steps-in-exponent-form",
        ["trainer.max_steps=1e3"],
        "trainer.max_steps=1000.0 must be an integer: write trainer.max_steps=1000",
    ),
    ("seed-too-large", ["seed=99999999999"], "seed=99999999999 must lie in [0, 2^32 − 1]"),
    ("steps-fraction", ["trainer.max_steps=1.5"], "trainer.max_steps=1.5 must be an integer"),
    ("steps-negative", ["trainer.max_steps=-5"], "trainer.max_steps=-5 must be a positive integer"),
    ("log-every-zero", ["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps=0 must be a positive integer"),
    ("clip-negative", ["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val=-1 must be ≥ 0"),
    ("accumulate-zero", ["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0 must be a positive"),
    ("devices-word", ["trainer.devices=abc"], "trainer.devices='abc' must be a positive count"),
    ("devices-zero", ["trainer.devices=0"], "trainer.devices=0 must be a positive count"),
    (
        "nodes-zero",
        ["trainer=ddp", "trainer.accelerator=cpu", "trainer.num_nodes=0"],
        "trainer.num_nodes=0 must be a positive integer",
    ),
    ("precision-unknown", ["trainer.precision=fp8"], "trainer.precision='fp8': use 32-true"),
    ("accelerator-unknown", ["trainer.accelerator=tpux"], "trainer.accelerator='tpux': use cpu, gpu"),
    ("val-interval-zero", ["trainer.val_check_interval=0"], "trainer.val_check_interval=0 must be a positive"),
    ("sanity-steps-negative", ["trainer.num_sanity_val_steps=-3"], "trainer.num_sanity_val_steps=-3 must be ≥ 0"),
    ("progress-bar-word", ["trainer.enable_progress_bar=maybe"], "enable_progress_bar='maybe' must be true or false"),
    ("eval-lengths-not-a-list", ["eval.lengths=abc"], "eval.lengths='abc' must be a list"),
    # (braces doubled: a row's arguments are format strings, {tmp} and {files} filled in)
    ("eval-lengths-a-mapping", ["eval.lengths={{a:1}}"], "gives a mapping where the config holds a list"),
    ("phases-a-mapping", ["phases={{at:3,pos:none}}"], "gives a mapping where the config holds a list"),
    ("phases-trainable-scheme", ["task=clm", "phases=[{{at:1,pos:t5}}]"], "phases[0].pos=t5 has trained parameters"),
    ("phases-past-the-end", ["task=clm", "phases=[{{at:99,pos:none}}]"], "before trainer.max_steps"),
    ("phases-typo", ["task=clm", "phases=[{{at:3,pso:none}}]"], "phases[0].pso is no phase key"),
    ("eval-lengths-fraction", ["eval.lengths=[1.5]"], "[1.5] are not positive integers"),
    ("eval-lengths-zero", ["eval.lengths=[0]"], "[0] are not positive integers"),
    # ---- length extrapolation
    ("eval-stride-zero", ["task=clm", "eval.lengths=[32]", "eval.stride=0"], "eval.stride=0 must be a positive"),
    ("eval-stride-word", ["eval.stride=abc"], "eval.stride='abc' must be an integer or null"),
    ("eval-stride-no-lengths", ["task=clm", "eval.stride=8"], "set eval.lengths=[...] too"),
    (
        "eval-stride-beyond-length",
        ["task=clm", "eval.lengths=[32,64]", "eval.stride=48"],
        "must not exceed the shortest eval length 32",
    ),
    ("eval-stride-mlm", ["eval.lengths=[32]", "eval.stride=8"], "a bidirectional task=mlm does not have"),
    ("eval-same-targets-mlm", ["eval.lengths=[32]", "eval.same_targets=8"], "use task=clm or drop eval.same_targets"),
    (
        "eval-same-targets-zero",
        ["task=clm", "eval.lengths=[32]", "eval.same_targets=0"],
        "eval.same_targets=0 must be a positive",
    ),
    ("eval-buckets-zero", ["eval.position_buckets=0"], "eval.position_buckets=0 must be a positive"),
    (
        "eval-scalings-unknown",
        ["eval.lengths=[64]", "eval.scalings=[none,foo]"],
        "['foo'] are not length scalings of pos=rope",
    ),
    (
        "eval-scalings-twice",
        ["eval.lengths=[64]", "eval.scalings=[ntk,ntk]"],
        "list each scaling once by name; use e.g.",
    ),
    (
        "eval-scalings-not-rope",
        ["pos=alibi", "eval.lengths=[64]", "eval.scalings=[yarn]"],
        "pos=alibi has none (only RoPE's angles can be rescaled)",
    ),
    (
        "eval-scalings-longrope-lists",
        ["eval.lengths=[64]", "eval.scalings=[longrope]"],
        "needs pos.scaling.short_factor=[...] and pos.scaling.long_factor=[...]",
    ),
    (
        "eval-finetune-no-scalings",
        ["eval.lengths=[64]", "eval.finetune_steps=5"],
        "fine-tunes under each eval.scalings entry",
    ),
    ("eval-finetune-negative", ["eval.finetune_steps=-1"], "eval.finetune_steps=-1 must be ≥ 0"),
    (
        "eval-finetune-length-unused",
        ["eval.lengths=[64]", "eval.finetune_length=64"],
        "unused with eval.finetune_steps=0",
    ),
    ("eval-finetune-lr-zero", ["eval.finetune_lr=0"], "eval.finetune_lr=0 must be a positive number"),
    ("val-every-zero", ["data.source.val_every=0"], "data.source.val_every=0 must be ≥ 2"),
    ("val-every-word", ["data.source.val_every=abc"], "data.source.val_every='abc' must be an integer"),
    ("batch-fraction", ["data.batch_size=1.5"], "data.batch_size=1.5 must be an integer"),
    ("seq-len-word", ["data.seq_len=abc"], "data.seq_len='abc' must be an integer"),
    ("eval-batches-word", ["data.eval_batches=abc"], "data.eval_batches='abc' must be an integer or null"),
    ("d-model-word", ["model.d_model=abc"], "model.d_model='abc' must be an integer"),
    ("layers-zero", ["model.n_layers=0"], "model.n_layers=0 must be a positive integer"),
    ("d-ff-zero", ["model.d_ff=0"], "model.d_ff=0 must be a positive integer"),
    # each DDP rank reads its own slice of the shards: every slice must hold a window, checked before rank 0 starts
    (
        "ddp-rank-slice-shorter-than-a-window",
        [
            "trainer=ddp",
            "trainer.devices=2",
            "trainer.accelerator=cpu",
            "data=tokens",
            "data.path={files}/shards",
            "data.seq_len=60000",
            "data.batch_size=1",
            "trainer.max_steps=2",
        ],
        "each of the 2 DDP ranks (trainer.devices × trainer.num_nodes) reads its own",
    ),
    ("loss-chunk-zero", ["model.loss_chunk=0"], "model.loss_chunk=0 must be a positive number of tokens or null"),
    ("loss-chunk-fraction", ["model.loss_chunk=1.5"], "model.loss_chunk=1.5 must be an integer or null"),
    ("dropout-nan", ["model.dropout=nan"], "model.dropout=nan must be a finite number"),
    ("dropout-negative", ["model.dropout=-0.1"], "model.dropout=-0.1 must lie in [0, 1)"),
    ("norm-unknown", ["model.norm=mid"], "model.norm='mid': use pre or post"),
    ("compile-word", ["model.compile=maybe"], "model.compile='maybe' must be true or false"),
    ("rope-base-word", ["pos.base=abc"], "pos.base='abc' must be a number"),
    ("rope-layout-unknown", ["pos.layout=foo"], "pos.layout='foo': use interleaved or half"),
    ("rope-fraction-zero", ["pos.fraction=0"], "0 × 16 is not a positive even integer"),
    (
        "rope-scaling-word",
        ["pos.scaling=foo"],
        "pos.scaling='foo' must be a config node with _target_ or null; "
        "pick one with pos/scaling=<name>: dynamic_ntk, linear",
    ),
    ("rope-scaling-unknown", ["pos/scaling=foo"], "use one of pos/scaling=dynamic_ntk, linear"),
    (
        "rope-scaling-option-at-pos",
        ["pos.factor=2"],
        "pos.factor is not a key of the chosen pos; it belongs to "
        "pos/scaling: pick one with pos/scaling=<name> (dynamic_ntk, linear, llama3, longrope, ntk, yarn) and set "
        "pos.scaling.factor=...",
    ),
    (
        "rope-scaling-unread-option",
        ["pos/scaling=linear", "pos.scaling.alpha=2"],
        "pos.scaling.alpha is not a key of the chosen pos/scaling; pos/scaling=yarn has it",
    ),
    ("rope-factor-below-one", ["pos/scaling=yarn", "pos.scaling.factor=0.5"], "pos.scaling.factor=0.5 must be ≥ 1"),
    ("rope-factor-nan", ["pos/scaling=ntk", "pos.scaling.factor=nan"], "pos.scaling.factor=nan must be a finite"),
    (
        "rope-scaling-not-rope",
        ["pos=alibi", "pos/scaling=yarn"],
        "pos/scaling is a choice of pos=rope, pos=rope_trainable only",
    ),
    ("t5-buckets-word", ["pos=t5", "pos.num_buckets=abc"], "pos.num_buckets='abc' must be an integer"),
    ("t5-max-distance-small", ["pos=t5", "pos.max_distance=1"], "pos.max_distance=1 must exceed num_buckets/2"),
    ("learned-init-word", ["pos=learned", "pos.init_std=abc"], "pos.init_std='abc' must be a number"),
    ("sinusoidal-flag-word", ["pos=sinusoidal", "pos.scale_embeddings=maybe"], "must be true or false"),
    ("window-word", ["attn=local", "attn.window=abc"], "attn.window='abc' must be an integer"),
    ("softmax-dropout-over-one", ["attn.dropout=1.5"], "attn.dropout=1.5 must lie in [0, 1)"),
    (
        "layers-unknown-name",
        ["+pos.layers=[rope,nope]"],
        "pos.layers names 'nope', which is no pos option; use names of",
    ),
    (
        "layers-not-dividing",
        ["+pos.layers=[rope,rope,none]"],
        "pos.layers has 3 entries, which does not divide model.n_layers=2",
    ),
    ("layers-embedding-scheme", ["+pos.layers=[rope,sinusoidal]"], "pos=sinusoidal adds to the token embeddings"),
    ("layers-without-the-option", ["+pos.layers=[none,alibi]"], "names no rope layer, so the pos=rope settings"),
    ("layers-not-a-list", ["+attn.layers=5"], "attn.layers=5 must be a list of attn option names"),
    (
        "layers-refused-layer",
        ["pos=xl", "+attn.layers=[softmax,local]"],
        "incompatible pairing at layer 1 (pos=xl, attn=local): attn=local cannot apply a content logit bias",
    ),
    (
        "rope-rotate-heads-over",
        ["pos.rotate_heads=3"],
        "pos.rotate_heads=3 must be a whole number of heads in 1 … model.n_heads=2",
    ),
    ("performer-features-zero", ["attn=performer", "attn.nb_features=0"], "attn.nb_features=0 must be a positive"),
    ("performer-redraw-zero", ["attn=performer", "attn.redraw_interval=0"], "attn.redraw_interval=0 must be"),
    ("rope-mode-unknown", ["attn=linear", "attn.rope_mode=foo"], "attn.rope_mode='foo': use pre_feature or numerator"),
    ("p-mask-negative", ["task.p_mask=-1"], "task.p_mask=-1 + task.p_random=0.1 must be ≥ 0"),
    ("mask-probabilities-over-one", ["task.p_mask=0.9", "task.p_random=0.5"], "must be ≥ 0 and sum to ≤ 1"),
    ("experiment-empty", ["logger.experiment="], "logger.experiment='' must name an MLflow experiment"),
    ("target-loss-negative", ["report.target_loss=-1"], "report.target_loss=-1 must be a positive number"),
    ("checkpoint-every-word", ["checkpoint.every_n_steps=abc"], "checkpoint.every_n_steps='abc' must be an integer"),
    ("resume-number", ["resume=1"], "resume=1: use resume=true, resume=auto"),
    ("group-replaced-by-value", ["eval=3"], "eval=3 replaces the config group eval"),
    ("plus-on-an-existing-key", ["+eval=3"], "An item is already at 'eval'. Either remove + prefix"),
    # ---- keys that do not exist (a typo added with +, in a known group or at the top)
    (
        "plus-typo-data",
        ["+data.batchsize=64"],
        "data.batchsize is not a setting of data (embedded); did you mean data.batch_size?",
    ),
    ("plus-typo-model", ["+model.dmodel=64"], "did you mean model.d_model?"),
    ("plus-typo-trainer", ["+trainer.max_step=5"], "did you mean trainer.max_steps?"),
    ("plus-typo-optimizer", ["+optim.optimizer.learning_rate=1"], "optim.optimizer.learning_rate is not a setting"),
    ("plus-typo-eval", ["+eval.length=[1]"], "did you mean eval.lengths?"),
    ("plus-typo-checkpoint", ["+checkpoint.everyn=1"], "did you mean checkpoint.every_n_steps?"),
    ("plus-typo-logger", ["+logger.experimnt=x"], "did you mean logger.experiment?"),
    ("plus-typo-report", ["+report.target=1"], "did you mean report.target_loss?"),
    ("plus-typo-t5", ["pos=t5", "+pos.num_bucket=8"], "did you mean pos.num_buckets?"),
    ("plus-typo-local", ["attn=local", "+attn.windows=8"], "did you mean attn.window?"),
    ("plus-typo-schedule", ["+optim.schedule.warmup=5"], "did you mean optim.schedule.warmup_steps?"),
    ("plus-unknown-top", ["+foo=1"], "foo is not a setting of the config"),
    ("plus-unknown-trainer-arg", ["+trainer.not_a_lightning_arg=1"], "trainer.not_a_lightning_arg is not a setting"),
    ("plus-typo-rope", ["+pos.bas=1"], "pos.bas is not a setting of pos=rope; did you mean pos.base?"),
    ("group-typo", ["poss=rope"], "did you mean pos=...?"),
    ("key-without-plus", ["optim.optimizer.eps=0"], "Could not override 'optim.optimizer.eps'"),
    ("unknown-data", ["data=foo"], "use one of data=embedded, enwik8, hf, text, tokens"),
    ("unknown-experiment", ["experiment=foo"], "use one of experiment=ablation, alibi_extrapolation"),
    ("ambiguous-sweep-value", ["pos=rope,t5"], "pos=rope,t5 is a sweep over several values: add -m to run a"),
    # ---- a sweep is checked whole before its first cell trains (harness/cli.py preflight)
    ("sweep-one-bad-cell", ["-m", "optim.optimizer.lr=1e-3,-1"], "cell optim.optimizer.lr=-1"),
    ("sweep-unknown-option", ["-m", "pos=rope,foo"], "Could not find 'pos/foo'"),
    (
        "sweep-bad-cell-of-a-preset",
        ["-m", "experiment=grid", "pos=rope", "attn=softmax", "seed=0", "model.dropout=2"],
        "model.dropout=2 must lie in [0, 1)",
    ),
    ("sweep-launcher-jobs-zero", ["-m", "pos=rope", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0 must be"),
    ("preset-sweep-without-m", ["experiment=grid"], "experiment=grid is a sweep over pos, attn, seed: add -m"),
    (
        "preset-unknown-arm",
        ["experiment=drope", "+experiment/drope/arm=foo", "seed=0"],
        "Could not find 'experiment/drope/arm/foo'; use one of +experiment/drope/arm=drope, rope",
    ),
    (
        "preset-arm-old-spelling",
        ["experiment=drope", "+arm=drope/rope", "+experiment/drope/arm=rope", "seed=0"],
        "arm is not a setting of the config; a preset's arms are in its folder now (conf/experiment/<preset>/arm/): "
        "+arm=<preset>/<arm> is +experiment/<preset>/arm=<arm>",
    ),
    (
        "tune-trials-zero",
        ["-m", "experiment=tune_lr", "hydra.sweeper.n_trials=0"],
        "hydra.sweeper.n_trials=0 must be a positive integer (trials per cell)",
    ),
    (
        "tune-trials-word",
        ["-m", "experiment=tune_lr", "hydra.sweeper.n_trials=abc"],
        "hydra.sweeper.n_trials='abc' must be a positive integer",
    ),
    ("tune-jobs-zero", ["-m", "experiment=tune_lr", "hydra.sweeper.n_jobs=0"], "hydra.sweeper.n_jobs=0 must be a"),
    (
        "tune-interval-negative",
        ["-m", "experiment=tune_lr", "optim.optimizer.lr=interval(-1,-0.5)"],
        "must be positive, e.g. optim.optimizer.lr=1e-3 (the sweep trained nothing, in 4 cells)",
    ),
    # ---- Hydra structure: a group removed, a class that is not one, an output dir that is none
    ("group-removed", ["~pos"], "the config has no pos (a run needs every group"),
    ("task-removed", ["~task"], "the config has no task (a run needs every group"),  # a ${task} defaults entry
    ("group-null", ["pos=null"], "pos=null would remove a config group a run needs; pick one of its options"),
    (
        "target-not-a-variant",
        ["attn._target_=builtins.dict"],
        "attn._target_=builtins.dict is not an attention "
        "variant: attn builds a subclass of attention.base.AttentionVariant",
    ),
    ("target-scheme-as-variant", ["attn._target_=positional.rope.Rope"], "is not an attention variant"),
    ("trainer-key-removed", ["~trainer.max_steps"], "trainer.max_steps is missing (removed with ~trainer.max_steps?)"),
    ("run-dir-empty", ["hydra.run.dir="], "hydra.run.dir='' names no directory"),
    # ---- tracking stores MLflow cannot open
    ("store-not-a-database", ["logger.tracking_uri=sqlite:///{files}/notdb.db"], "exists but is not an sqlite"),
    ("store-is-a-directory", ["logger.tracking_uri=sqlite:///{files}"], "names a directory; name a database file"),
    (
        "store-dangling-link",
        ["logger.tracking_uri=sqlite:///{files}/dangling.db"],
        "which does not exist; point the link at the store",
    ),
    ("store-file-scheme", ["logger.tracking_uri=file:///{files}/mlruns"], "MLflow's file store, which MLflow 3"),
    ("store-relative-two-slashes", ["logger.tracking_uri=sqlite://rel.db"], "is not sqlite:////absolute/path.db"),
    ("store-server-not-there", ["logger.tracking_uri=http://127.0.0.1:9"], "does not answer"),
    ("store-bad-port", ["logger.tracking_uri=http://127.0.0.1:abc"], "has a malformed port"),
    ("store-no-scheme", ["logger.tracking_uri=mlflow.db"], "has scheme '', which MLflow cannot open"),
    # ---- resources that cannot fit
    ("eval-length-beyond-split", ["eval.lengths=[10000000]"], "exceed the validation split"),
    ("model-too-large", ["model.d_model=4096", "model.n_layers=2000", "model.n_heads=32"], "but"),
    ("batch-too-large", ["data.batch_size=100000000"], "training needs at least"),
    # the fix names what is too large: depth whatever the batch, the vocabulary's embeddings, or the logits
    (
        "depth-alone-too-large",
        ["model.n_layers=3000", "model.d_model=1024", "model.n_heads=8", "model.d_ff=4096"],
        "the parameters alone do not fit, whatever the batch: lower model.n_layers=3000",
    ),
    (
        "vocabulary-alone-too-large",
        ["tokenizer=bpe", "tokenizer.vocab_size=400000000"],
        "mostly the embeddings: lower tokenizer.vocab_size=400000000",
    ),
    (
        "logits-too-large",
        ["tokenizer=bpe", "tokenizer.vocab_size=4000000", "data.batch_size=64", "data.seq_len=512"],
        "the logits hold most of a step: lower tokenizer.vocab_size=4000000",
    ),
    ("scale-the-preset-lacks", ["-m", "experiment=rope_scaling", "scale=smoke"], "has no scale=smoke"),
    (
        "finetune-beyond-train-split",
        [
            "task=clm",
            "eval.lengths=[128]",
            "eval.scalings=[none]",
            "eval.finetune_steps=1",
            "eval.finetune_length=10000000",
        ],
        "exceeds the training split",
    ),
    (
        "finetune-too-large",
        [
            "task=clm",
            "eval.lengths=[128]",
            "eval.scalings=[none]",
            "eval.finetune_steps=1",
            "eval.finetune_length=1000000",
            "model.d_model=1024",
            "model.n_heads=4",
        ],
        "fine-tuning at eval.finetune_length=1000000 (1×1000000 tokens) needs",
    ),
    # ---- sizes a scheme, a variant or a task makes large: the run rehearsed on meta names the key
    ("fire-mlp-huge", ["pos=fire", "pos.mlp_width=100000000"], "lower pos.mlp_width=100000000, which sets that size"),
    (
        "performer-features-huge",
        ["attn=performer", "attn.nb_features=100000000"],
        "lower attn.nb_features=100000000, which sets that size",
    ),
    (
        "max-position-huge",
        ["pos=t5", "pos.randomize=true", "pos.max_position=1000000000000"],
        "lower pos.max_position=1000000000000, which sets that size",
    ),
    ("cope-npos-huge", ["pos=cope", "pos.npos=100000000"], "lower pos.npos=100000000, which sets that size"),
    (
        "task-eval-length-huge",
        ["task=copy", "task.eval_lengths=[80,100000000]"],
        "drop 100000000 from task.eval_lengths or shorten it",
    ),
    (
        "task-eval-length-slow",
        ["task=copy", "task.eval_lengths=[80,400000]"],  # fits memory, computes for hours
        "drop 400000 from task.eval_lengths or shorten it",
    ),
    ("devices-beyond-cores", ["trainer.devices=64"], "trainer.devices=64 starts 64 training processes on this"),
    # ---- ranges declared in a constructor's signature (harness/ranges.py)
    ("t5-init-negative", ["pos=t5", "pos.init_std=-1"], "pos.init_std=-1 must be a number ≥ 0"),
    ("cope-init-negative", ["pos=cope", "pos.init_std=-1"], "pos.init_std=-1 must be a number ≥ 0"),
    ("xl-init-negative", ["pos=xl", "pos.init_std=-1"], "pos.init_std=-1 must be a number ≥ 0"),
    ("fire-eps-negative", ["pos=fire", "pos.eps=-1"], "pos.eps=-1 must be a positive number"),
    ("xpos-gamma-zero", ["pos=xpos", "pos.gamma=0"], "pos.gamma=0 must be a positive number"),
    (
        "performer-features-null-ok-but-negative",
        ["attn=performer", "attn.nb_features=-3"],
        "attn.nb_features=-3 must be a positive integer (or null)",
    ),
    # ---- data paths
    ("data-directory-not-utf8", ["data=text", "data.path={files}/mixed"], "is not UTF-8 (bad byte at offset"),
    ("data-empty-directory", ["data=text", "data.path={files}/nothing"], "is a directory with no files in it"),
    ("data-only-hidden-files", ["data=text", "data.path={files}/hidden"], "is a directory with no files in it"),
    ("data-utf16", ["data=text", "data.path={files}/utf16.txt"], "is UTF-16, not UTF-8 text; convert it (iconv"),
    ("data-gzip", ["data=text", "data.path={files}/small.txt.gz"], "is gzip-compressed, not UTF-8 text; gunzip"),
    ("data-fifo", ["data=text", "data.path={files}/fifo"], "is not a regular file; point data.path at the file"),
    ("data-under-a-file", ["data=text", "data.path={files}/small.txt/x"], "does not exist; point it at a UTF-8"),
    (
        "data-path-embedded",
        ["data.path={files}/small.txt"],
        "data.path is not a key of the chosen data; data=enwik8, data=hf, data=text, data=tokens have it",
    ),
    ("data-plus-path-embedded", ["+data.path={files}/small.txt"], "data=embedded does not read data.path"),
    (
        "data-download-text",
        ["data=text", "data.path={files}/small.txt", "data.download=false"],
        "data.download is not a key of the chosen data; data=enwik8 has it",
    ),
    ("enwik8-is-a-directory", ["data=enwik8", "data.path={files}/nothing"], "is a directory without an enwik8 file"),
    ("enwik8-directory-holding-it", ["data=enwik8", "data.path={files}/e8"], "e8/enwik8 holds 1,000 bytes"),
    ("enwik8-empty", ["data=enwik8", "data.path={files}/empty.txt"], "holds 0 bytes, enwik8 holds 100,000,000"),
    ("enwik8-zip", ["data=enwik8", "data.path={files}/enwik8.zip"], "is the zip archive; unzip it"),
    ("enwik8-fifo", ["data=enwik8", "data.path={files}/fifo"], "is not a regular file"),
    # ---- optim.tuned: a best.json of `python -m results tune`
    ("tuned-missing-file", ["optim.tuned={files}/none.json"], "none.json: no such file"),
    ("tuned-not-json", ["optim.tuned={files}/empty.txt"], "not a best.json of python -m results tune"),
    (
        "tuned-unknown-cell",
        ["optim.tuned={files}/tuned.json"],
        "has no tuned values for pos=rope attn=softmax (it has: pos=t5 attn=softmax); tune it",
    ),
    (
        "tuned-bad-value",
        ["optim.tuned={files}/tuned_bad.json"],
        "optim.optimizer.lr=-1 must be positive, e.g. optim.optimizer.lr=1e-3 (the value comes from optim.tuned=",
    ),
    (
        "path-not-ascii-unquoted",
        ["data=text", "data.path={files}/my dir/fïle.txt"],
        """quote the value for Hydra inside the shell's quotes: 'data.path=""",
    ),
    (
        "tuned-unknown-key",
        ["pos=t5", "optim.tuned={files}/tuned.json"],
        "sets optim.optimizer.learning_rate, which this config does not have",
    ),
    (
        "tuned-changed-digit",
        ["optim.tuned={files}/tuned_changed.json"],
        "tuned_changed.json changed after python -m results tune wrote it (its sha256 no longer matches)",
    ),
]

# `python -m results ...` rows: (id, args, text the line must contain)
RESULTS_CASES = [
    (
        "paper-store-of-another-project",
        ["paper", "--preset", "drope", "--tracking-uri", "sqlite:///{files}/another.db", "--out", "{tmp}/out"],
        "holds no posbench run (none has a pos tag): another project's runs?",
    ),
    (
        "results-no-store",
        ["report", "--out", "{tmp}/out", "--tracking-uri", "sqlite:///{tmp}/none.db"],
        "no MLflow store at",
    ),
    (
        "results-out-unwritable",
        ["report", "--out", "{files}/empty.txt/out", "--tracking-uri", "{store}"],
        "--out: cannot create",
    ),
    ("results-bad-store-scheme", ["report", "--out", "{tmp}/o", "--tracking-uri", "foo://bar"], "has scheme 'foo'"),
    (
        "results-unknown-experiment",
        ["report", "--experiment", "nope", "--out", "{tmp}/o", "--tracking-uri", "{store}"],
        "no experiment 'nope' in this store",
    ),
    ("results-unknown-preset", ["paper", "--preset", "nope"], "--preset 'nope' is not a preset; use one of"),
    (
        "results-bad-scale",
        ["paper", "--preset", "grid", "--scale", "huge"],
        "--scale huge: preset grid has no such scale; use one of paper, smoke, toy",
    ),
    (
        "results-scale-the-preset-lacks",
        ["paper", "--preset", "rope_scaling", "--scale", "smoke"],
        "preset rope_scaling has no such scale; use one of paper, toy",
    ),
    ("results-missing-out", ["report"], "the following arguments are required: --out"),
    (
        "results-target-word",
        ["report", "--out", "{tmp}/o", "--target", "abc"],
        "argument --target: 'abc' is not a number",
    ),
    ("results-unknown-command", ["nope"], "invalid choice: 'nope'"),
    ("results-no-command", [], "the following arguments are required: command"),
    (
        "results-tune-unknown-experiment",
        ["tune", "--experiment", "nope", "--out", "{tmp}/o", "--tracking-uri", "{store}"],
        "no experiment 'nope' in this store",
    ),
    # ---- a run's record changed in the store since it closed: its seal (harness/integrity.py)
    # ---- a report folder changed after its command sealed it (SHA256SUMS): the index reads each README back
    ("results-index-report-changed", ["index", "--dir", "{files}/reports"], "grid/README.md is damaged (its sha256"),
    (
        "results-record-bit-flipped",
        ["report", "--out", "{tmp}/o", "--tracking-uri", "sqlite:///{files}/flipped.db"],
        "in the tracking store is damaged: a metric's latest value differs from its seal",
    ),
    (
        "results-record-param-edited",
        ["report", "--out", "{tmp}/o", "--tracking-uri", "sqlite:///{files}/edited.db"],
        "in the tracking store is damaged: a param differs from its seal",
    ),
    (
        "results-tune-record-seal-key",
        ["tune", "--experiment", "posbench", "--out", "{tmp}/o", "--tracking-uri", "sqlite:///{files}/unkeyed.db"],
        "in the tracking store is damaged: its seal's key reads 'posbench.sea1'",
    ),
]

RESULTS_CASES += [  # the values run.py's report.* refuses, and where the report would go
    ("results-min-order-gain-nan", ["report", "--out", "{tmp}/o", "--min-order-gain", "nan"], "nan must be a finite"),
    (
        "results-min-order-gain-negative",
        ["report", "--out", "{tmp}/o", "--min-order-gain", "-1"],
        "argument --min-order-gain: -1 must be a number ≥ 0",
    ),
    ("results-target-inf", ["report", "--out", "{tmp}/o", "--target", "inf"], "argument --target: inf must be a"),
    ("results-out-empty", ["report", "--out", "", "--tracking-uri", "{store}"], "--out '' names no folder"),
    (
        "results-out-proc",
        ["report", "--out", "/proc/posbench", "--tracking-uri", "{store}"],
        "--out: cannot write /proc/posbench",
    ),
    (
        "results-store-truncated",
        ["report", "--out", "{tmp}/o", "--tracking-uri", "sqlite:///{files}/truncated.db"],
        "is a damaged sqlite database (truncated:",
    ),
    ("results-store-bad-uri", ["tune", "--out", "{tmp}/o", "--tracking-uri", "http://[bad"], "does not parse as a URI"),
]

# `python -m harness.bench ...` rows: refused before the first measurement (which takes minutes)
BENCH_CASES = [
    ("bench-cell-s-nan", ["--cell-s", "nan"], "argument --cell-s: nan must be a finite number"),
    ("bench-warmup-negative", ["--warmup", "-1"], "argument --warmup: -1 must be a number ≥ 0"),
    ("bench-out-proc", ["--out", "/proc/posbench"], "--out: cannot write /proc/posbench"),
    ("bench-out-empty", ["--out", ""], "--out '' names no folder"),
    ("bench-store-relative", ["--tracking-uri", "sqlite:///rel.db"], "is not sqlite:////absolute/path.db"),
    ("bench-store-bad-uri", ["--tracking-uri", "http://[bad"], "does not parse as a URI"),
    ("bench-store-not-there", ["--tracking-uri", "http://127.0.0.1:9"], "does not answer"),
    ("bench-store-truncated", ["--tracking-uri", "sqlite:///{files}/truncated.db"], "is a damaged sqlite database"),
    # found by tools/fuzz.py (hostile values for every flag of every command's parser)
    ("bench-model-unknown", ["--model", "abc"], "--model 'abc': not in conf/model/; valid: "),
    (
        "bench-warmup-unbounded",
        ["--warmup", "99999999999999999999"],
        "argument --warmup: 99999999999999999999 must be at most 1,000",
    ),
    ("bench-lengths-unbounded", ["--lengths", "99999999999999999999"], "every length must be at most 16,777,216"),
]

RUN_CASES += [
    ("store-truncated", ["logger.tracking_uri=sqlite:///{files}/truncated.db"], "is a damaged sqlite database"),
    # ---- --check for a GPU of a named size (harness/config/resources.py gpu_estimate)
    (
        "gpu-memory-without-check",
        ["--gpu-memory=80GB"],
        "--gpu-memory sizes the GPU that --check checks a run for; add --check",
    ),
    (
        "gpu-memory-no-unit",
        ["--check", "--gpu-memory=80", "trainer=gpu"],
        "--gpu-memory='80' is not a memory size; give a number and a unit",
    ),
    ("gpu-memory-no-value", ["--check", "--gpu-memory=", "trainer=gpu"], "--gpu-memory needs a size"),
    (
        "gpu-too-small",
        ["--check", "--gpu-memory=0.5MB", "trainer=gpu"],
        "on a GPU of 0.5MB (0.0 GiB) a training step does not fit: it needs at least",
    ),
    # ---- overflows, a --config-dir that is no folder
    ("gpu-memory-overflow", ["--check", "--gpu-memory=1e300TB", "trainer=gpu"], "is larger than any GPU"),
    ("steps-overflow", ["trainer.max_steps=99999999999999999999"], "is more steps than any run takes"),
    # found by tools/fuzz.py (hostile values for every key of every option): torch's own overflow
    (
        "int-beyond-64-bits",
        ["pos=cope", "pos.npos=99999999999999999999"],
        "pos.npos=99999999999999999999 is beyond a 64-bit integer (at most 2^63 − 1); give a smaller value",
    ),
    (
        "int-beyond-64-bits-for-a-float",
        ["pos=fire", "pos.eps=99999999999999999999"],
        "is beyond a 64-bit integer (at most 2^63 − 1); write it as a float, e.g. 1e+20",
    ),
    (
        "int-beyond-64-bits-in-a-variant",
        ["attn=performer", "attn.nb_features=99999999999999999999"],
        "attn.nb_features=99999999999999999999 is beyond a 64-bit integer",
    ),
    ("mixture-parts-not-a-list", ["task=mixture", "task.parts=-1"], "task.parts=-1 must be a list of strings"),
    # check and run decide alike: what Lightning refuses when the Trainer is built, refused by --check too
    (
        "check-val-every-n-epoch",
        ["trainer.check_val_every_n_epoch=0"],
        "trainer.check_val_every_n_epoch=0: posbench validates every trainer.val_check_interval optimizer steps",
    ),
    ("devices-empty-list", ["trainer.devices=[]"], "trainer.devices=[] names no device; give a count"),
    (
        "strategy-unknown",
        ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.strategy=abc"],
        "trainer.strategy='abc' is not a Lightning strategy; use auto, ddp, ",
    ),
    (
        "mixture-alphabets-not-a-mapping",
        ["task=mixture", "task.alphabets=abc"],
        "task.alphabets='abc' must be a mapping or null",
    ),
    ("config-dir-missing", ["--config-dir={files}/nope"], "nope' not found; --config-dir (-cd) takes an existing"),
    ("config-dir-a-file", ["--config-dir={files}/small.txt"], "small.txt' not found; --config-dir (-cd) takes"),
    (
        "config-dir-bad-yaml",
        ["--config-dir={files}/userconf", "pos=broken"],
        "pos/broken.yaml, line 4, column 1 is not valid YAML (expected ',' or ']', but got '<stream end>')",
    ),
    # ---- a prepared folder's shard changed after prepare wrote it: hashed whole at the start (a folder of at most
    # $POSBENCH_HASH_WHOLE_BYTES), else each block when a read first reaches it (in the run's process or a worker's)
    (
        "shard-byte-flipped",
        ["data=tokens", "data.path={files}/shards_rotted"],
        "train-00000.bin is damaged (its sha256",
    ),
    (
        "shard-manifest-edited",
        ["data=tokens", "data.path={files}/shards_edited"],
        "manifest.json is damaged (its content no longer matches its sha256)",
    ),
    (
        "shard-vocabulary-flipped",
        ["data=tokens", "data.path={files}/shards_bpe", "tokenizer=bpe", "tokenizer.vocab_size=300", "task=clm"],
        "tokenizer.json is damaged (its sha256",
    ),
    (
        "hash-whole-bytes-not-a-number",
        ["ENV:POSBENCH_HASH_WHOLE_BYTES=1GB", "data=tokens", "data.path={files}/shards"],
        "POSBENCH_HASH_WHOLE_BYTES='1GB' must be a whole number of bytes",
    ),
    # ---- a nested value is checked where it was typed, with its own path: phases[i], pos.layers[i]
    (
        "phases-factor-nan",
        ["task=clm", "phases=[{{at: 1, scaling: yarn, factor: nan}}]"],
        "phases[0].factor=nan must be a finite number",
    ),
    (
        "phases-factor-inf",
        ["task=clm", "phases=[{{at: 1, scaling: yarn, factor: inf}}]"],
        "phases[0].factor=inf must be a finite number",
    ),
    (
        "phases-factor-overflow",
        ["task=clm", "phases=[{{at: 1, scaling: yarn, factor: 1e308}}]"],
        "phases[0].factor=1e+308 must be a number > 1",
    ),
    (
        "phases-pos-base-zero",
        ["task=clm", "phases=[{{at: 1, pos: 'rope(base=0)'}}]"],
        "phases[0].pos.base=0 must be a positive finite number",
    ),
    (
        "phases-pos-unknown",
        ["task=clm", "phases=[{{at: 1, pos: nonexistent}}]"],
        "phases[0].pos names 'nonexistent', which is no pos option; use names of conf/pos/",
    ),
    (
        "layers-entry-base-zero",
        ["model.n_layers=2", "+pos.layers=['rope(base=0)',rope]"],
        "pos.layers[0].base=0 must be a positive finite number",
    ),
    (
        "layers-entry-malformed",
        ["+pos.layers=['rope(base=1e6)(x=1)']"],
        "pos.layers[0]='rope(base=1e6)(x=1)' is no entry; write an option name",
    ),
    ("layers-entry-unknown-option", ["+pos.layers=[foo]"], "pos.layers names 'foo', which is no pos option"),
    ("layers-entry-key-twice", ["+pos.layers=['rope(base=1e6, base=2)']"], "sets base twice; give each setting once"),
    (
        "temperature-init-overflow",
        ["model=modern", "task=clm", "model.temperature=ssmax", "model.temperature_init=1e308"],
        "must be within float32's range",
    ),
    (
        "export-after-scaling-phase",
        ["model=modern", "task=clm", "export=hf", "phases=[{{at: 1, scaling: yarn, factor: 2}}]"],
        "export=hf writes the model's RoPE without a training-time scaling",
    ),
    # ---- values the earlier rounds left to a library's own text
    (
        "max-position-int64",
        ["pos.randomize=true", "pos.max_position=9223372036854775807"],
        "pos.max_position=9223372036854775807 must be at most 1,099,511,627,776",
    ),
    ("tuned-values-a-string", ["optim.tuned={files}/tuned_string.json"], "are not a mapping of keys to numbers"),
    ("seed-sweep-without-m", ["seed=0,1"], "seed=0,1 is a sweep over several values: add -m"),
    ("accelerator-tpu-absent", ["trainer.accelerator=tpu"], "trainer.accelerator=tpu needs a TPU and torch_xla"),
    (
        "fp16-autocast-on-cpu",
        ["trainer.precision=16-mixed"],
        "trainer.precision=16-mixed on the CPU: Lightning trains bf16-mixed instead",
    ),
    (
        "val-check-interval-over-one",
        ["trainer.val_check_interval=1.5"],
        "trainer.val_check_interval=1.5 must be a whole number of optimizer steps or a fraction ≤ 1",
    ),
    ("cfg-unknown-part", ["--cfg=foo"], "--cfg foo: --cfg prints the config; use --cfg job, hydra or all"),
    (
        "hf-parquet-schemas-differ",
        ["data=hf", "data.path={files}/parquets"],
        "b.parquet's columns (text: int64, other: string) differ from a.parquet's",
    ),
    ("hf-parquet-damaged", ["data=hf", "data.path={files}/notparquet"], "is not a readable parquet file"),
]

# Damage a run meets only as it reads (``python run.py`` rows): one line, exit 2, and the run it had opened closed
# FAILED with the line as its failure_reason — none left RUNNING. A large folder's shards are checked block by block
# as reads reach them ($POSBENCH_HASH_WHOLE_BYTES=0 makes this small folder one), in the run's process or a worker's.
DURING_RUN_CASES = [
    (
        "shard-block-rotted",
        ["ENV:POSBENCH_HASH_WHOLE_BYTES=0", "data=tokens", "data.path={files}/shards_rotted"],
        "train-00000.bin is damaged: its bytes 0–",
    ),
    (
        "shard-block-rotted-in-a-worker",
        ["ENV:POSBENCH_HASH_WHOLE_BYTES=0", "data=tokens", "data.path={files}/shards_rotted", "data.num_workers=1"],
        "train-00000.bin is damaged: its bytes 0–",
    ),
]

# ``python run.py --matrix|--list`` mistakes (harness/cli.py: refused outside Hydra's app, before any store): (id,
# argv, text the line must contain); the line is all the command prints
LISTING_CASES = [
    ("matrix-format", ["--matrix=foo"], "unknown matrix format 'foo'; use --matrix or --matrix=md"),
    ("matrix-setting", ["--matrix", "model.d_model=abc"], "--matrix lists every option and takes no setting but"),
    ("list-group", ["--list", "pos"], "--list lists every option and takes no setting but --config-dir DIR"),
    (
        "matrix-target",
        ["--matrix", "pos._target_=nope.X"],
        "pos._target_='nope.X' cannot be imported (No module named 'nope')",
    ),
    (
        "matrix-pattern",
        ["--matrix", "pos.layers=[rope,nope]"],
        "pos.layers names 'nope', which is no pos option; use names of",
    ),
    (
        "list-config-dir",
        ["--list", "--config-dir", "/nonexistent/conf"],
        "'/nonexistent/conf' not found; --config-dir (-cd) takes an",
    ),
]

# `posbench bench gpu|attention ...` rows: the benchmarks' other parts, refused before the first measurement
POSBENCH_CASES = [
    (
        "bench-gpu-steps-word",
        ["bench", "gpu", "--out", "{tmp}/gpu", "--steps", "abc"],
        "argument --steps: 'abc' is not an integer",
    ),
    (
        "bench-gpu-steps-unbounded",
        ["bench", "gpu", "--out", "{tmp}/gpu", "--steps", "99999999999999999999"],
        "argument --steps: 99999999999999999999 must be at most 10,000",
    ),
    ("bench-gpu-out-proc", ["bench", "gpu", "--out", "/proc/posbench"], "--out: cannot write /proc/posbench"),
    ("bench-gpu-out-a-file", ["bench", "gpu", "--out", "{files}/empty.txt"], "is not a directory); choose a folder"),
    (
        "bench-gpu-tokens-under-a-sequence",
        ["bench", "gpu", "--out", "{tmp}/gpu", "--tokens", "8", "--length", "16"],
        "--tokens 8 is less than one sequence of --length 16; raise --tokens",
    ),
    (
        "bench-gpu-render-no-folder",
        ["bench", "gpu", "--out", "{tmp}/none", "--render"],
        "is no folder; --render rewrites README.md",
    ),
    (
        "bench-attention-threads-negative",
        ["bench", "attention", "--threads", "-5"],
        "argument --threads: -5 must be a positive integer",
    ),
    (
        "bench-attention-repeats-word",
        ["bench", "attention", "--repeats", "abc"],
        "argument --repeats: 'abc' is not an integer",
    ),
    (
        "bench-loader-batches-unbounded",
        ["bench", "loader", "--batches", "99999999999999999999"],
        "argument --batches: 99999999999999999999 must be at most 100,000",
    ),
    (
        "bench-loader-json-under-proc",
        ["bench", "loader", "--json", "/proc/posbench.json"],
        "--json: cannot write /proc",
    ),
    # ---- `posbench prepare DIR [overrides]`: its folder, flags and source, refused before a shard is written
    ("prepare-dir-empty", ["prepare", "", "data=text", "data.path={files}/small.txt"], "DIR '' names no folder"),
    (
        "prepare-dir-a-file",
        ["prepare", "{files}/empty.txt", "data=text", "data.path={files}/small.txt"],
        "empty.txt is not a directory); choose another DIR",
    ),
    (
        "prepare-dir-under-proc",
        ["prepare", "/proc/posbench", "data=text", "data.path={files}/small.txt"],
        "DIR: cannot write /proc/posbench (",
    ),
    (
        "prepare-dir-already-prepared",
        ["prepare", "{files}/shards", "data=text", "data.path={files}/small.txt"],
        "already holds prepared shards (manifest.json); remove it or choose another DIR",
    ),
    (
        "prepare-shard-tokens-zero",
        ["prepare", "{tmp}/o", "--shard-tokens", "0"],
        "--shard-tokens=0 must be a positive number of token ids",
    ),
    (
        "prepare-source-missing",
        ["prepare", "{tmp}/o", "data=text", "data.path={files}/nope.txt"],
        "nope.txt does not exist; point it at a UTF-8 text file or directory",
    ),
    # ---- `posbench check|matrix|list`: the subcommands over the config, refused as `python run.py` refuses
    ("check-unknown-pos", ["check", "pos=foo"], "Could not find 'pos/foo'; use one of pos="),
    ("matrix-takes-no-setting", ["matrix", "model.d_model=64"], "--matrix lists every option and takes no setting"),
    ("list-takes-no-setting", ["list", "pos=rope"], "--list lists every option and takes no setting"),
    # ---- a model posbench exported (export=hf), changed since: its seals (harness/integrity.py)
    (
        "hf-eval-export-weights-flipped",
        [
            "hf-eval",
            "{files}/export_flipped",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "model.safetensors is damaged",
    ),
    (
        "hf-eval-export-config-edited",
        [
            "hf-eval",
            "{files}/export_edited",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "config.json is damaged",
    ),
    ("hf-rope-export-config-edited", ["hf-rope", "{files}/export_edited"], "config.json is damaged"),
    (
        "hf-eval-model-without-tokenizer",
        ["hf-eval", "{files}/export_untokenized", "--lengths", "16", "--budget", "64", "--check"],
        "holds no tokenizer (tokenizer.json); save the tokenizer beside the model",
    ),
    # ---- a model folder is input too, read and checked before anything is loaded
    (
        "hf-rope-config-missing",
        ["hf-rope", "{files}/missing.json"],
        "missing.json does not exist; give a transformers config.json or the folder holding one",
    ),
    ("hf-rope-config-a-list", ["hf-rope", "{files}/hf_list"], "holds list, not a transformers config (an object)"),
    ("hf-rope-hidden-size-word", ["hf-rope", "{files}/hf_hidden_word"], "hidden_size='abc' must be an integer"),
    (
        "hf-rope-hidden-size-negative",
        ["hf-rope", "{files}/hf_hidden_negative"],
        "hidden_size=-32 must be a positive integer",
    ),
    ("hf-rope-heads-zero", ["hf-rope", "{files}/hf_heads_zero"], "num_attention_heads=0 must be a positive integer"),
    ("hf-rope-theta-word", ["hf-rope", "{files}/hf_theta_word"], "rope_theta='abc' must be a number"),
    ("hf-rope-theta-negative", ["hf-rope", "{files}/hf_theta_negative"], "rope_theta=-5.0 must be a positive finite"),
    ("hf-rope-theta-nan", ["hf-rope", "{files}/hf_theta_nan"], "rope_theta=nan must be a finite number"),
    (
        "hf-rope-partial-zero",
        ["hf-rope", "{files}/hf_partial_zero"],
        "partial_rotary_factor=0 must be a number in (0, 1]",
    ),
    ("hf-rope-parameters-a-word", ["hf-rope", "{files}/hf_params_word"], "rope_parameters='default' must be a mapping"),
    (
        "hf-rope-type-unknown",
        ["hf-rope", "{files}/hf_type_unknown"],
        "rope_parameters.rope_type='foo' is no rope type transformers knows",
    ),
    (
        "hf-rope-layers-unbounded",
        ["hf-rope", "{files}/hf_layers_huge"],
        "num_hidden_layers=100000000 must be at most 10,000",
    ),
    (
        "hf-eval-model-type-unknown",
        [
            "hf-eval",
            "{files}/hf_type_model",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "model_type='foo' is no causal LM transformers",
    ),
    (
        "hf-eval-weights-truncated",
        [
            "hf-eval",
            "{files}/hf_truncated",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "is not a whole safetensors file",
    ),
    (
        "hf-eval-weights-header-flipped",
        [
            "hf-eval",
            "{files}/hf_header_flipped",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "is not a whole safetensors file",
    ),
    (
        "hf-eval-weights-missing",
        [
            "hf-eval",
            "{files}/hf_no_weights",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "holds no weights",
    ),
    (
        "hf-eval-weights-shape",
        [
            "hf-eval",
            "{files}/hf_wrong_shape",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "but config.json says vocab_size × hidden_size",
    ),
    (
        "hf-eval-tokenizer-not-json",
        [
            "hf-eval",
            "{files}/hf_bad_tokenizer",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
        ],
        "tokenizer.json is not a tokenizers JSON",
    ),
    (
        "hf-eval-text-not-utf8",
        [
            "hf-eval",
            "{files}/hf_model",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--tracking-uri",
            "{store}",
            "--text",
            "{files}/latin1.txt",
        ],
        "latin1.txt is not UTF-8 (bad byte at offset 3)",
    ),
    (
        "hf-eval-weights-not-finite",
        [
            "hf-eval",
            "{files}/hf_nan_weights",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--passkey-trials",
            "0",
            "--key-short",
            "0",
            "--scalings",
            "none",
            "--tracking-uri",
            "{store}",
        ],
        "holds 1 NaN or infinite values",
    ),
    (
        "hf-eval-tokenizer-of-another-model",
        [
            "hf-eval",
            "{files}/hf_other_tokenizer",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--passkey-trials",
            "0",
            "--key-short",
            "0",
            "--scalings",
            "none",
            "--tracking-uri",
            "{store}",
        ],
        "and its model embeds 64 ids: another model's tokenizer; save the model's own tokenizer beside it",
    ),
    (
        "prepare-shard-tokens-one",
        ["prepare", "{tmp}/o", "data=text", "data.path={files}/small.txt", "--shard-tokens", "1"],
        "--shard-tokens=1 would write up to",
    ),
    ("prepare-seq-len-a-word", ["prepare", "{tmp}/o", "data.seq_len=abc"], "data.seq_len='abc' must be an integer"),
    (
        "hf-eval-claim-no-names",
        [
            "hf-eval",
            "{files}/hf_model",
            "--lengths",
            "16",
            "--budget",
            "64",
            "--check",
            "--claim",
            "<",
            "--tracking-uri",
            "{store}",
        ],
        "--claim=<: order two or more distinct",
    ),
    (
        "hf-eval-lm-eval-task-unknown",
        ["hf-eval", "{files}/hf_model", "--lengths", "16", "--budget", "64", "--check", "--lm-eval", "niah_singel_1"],
        "--lm-eval=niah_singel_1: niah_singel_1 is no lm-eval task; offline ones: niah_single_1",
    ),
    (
        "hf-eval-lm-eval-limit-zero",
        ["hf-eval", "{files}/hf_model", "--lengths", "16", "--budget", "64", "--lm-eval-limit", "0"],
        "--lm-eval-limit=0 must be at least 1 (documents per task)",
    ),
    (
        "hf-eval-lm-eval-lengths-one",
        ["hf-eval", "{files}/hf_model", "--lengths", "16", "--budget", "64", "--lm-eval-lengths", "1"],
        "--lm-eval-lengths=1: each must be 2 tokens or more",
    ),
    (
        "hf-eval-lm-eval-length-too-short",
        ["hf-eval", "{files}/hf_model", "--lengths", "64", "--budget", "64", "--check", "--lm-eval", "niah_single_1"],
        "--lm-eval=niah_single_1 at --lengths 64: Could not generate any sample",
    ),
    (
        "hf-eval-tasks-unknown",
        ["hf-eval", "{files}/hf_model", "--lengths", "16", "--budget", "64", "--tasks", "niah_single,needle"],
        "--tasks=niah_single,needle: needle is no task; use niah_single, niah_multikey",
    ),
    (
        "hf-eval-task-trials-zero",
        ["hf-eval", "{files}/hf_model", "--lengths", "16", "--budget", "64", "--tasks", "vt", "--task-trials", "0"],
        "--task-trials=0 must be at least 1 (prompts per variant and length)",
    ),
    ("ruler-variant-unknown", ["task=ruler", "task.variant=niah"], "task.variant='niah' is no RULER variant; use one"),
]

ROWS = (
    [("run", *c) for c in RUN_CASES]
    + [("results", *c) for c in RESULTS_CASES]
    + [("harness.bench", *c) for c in BENCH_CASES]
    + [("posbench", *c) for c in POSBENCH_CASES]
)


def prepare_inputs(d: Path, empty_store: Path, rows: list | None = None) -> Path:
    """The files the rows name as ``{files}/...``, written into the empty folder ``d``: every row's, or only those
    ``rows`` name of the ones that take seconds to build (models, stores, shards, exports, parquet files). Each store
    starts as a copy of ``empty_store`` (migrated once: a store's schema migrations cost seconds, a copy does not)."""
    wanted = _named_by(rows)
    (d / "empty.txt").write_bytes(b"")
    (d / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e ".encode("latin-1") * 500)
    (d / "small.txt").write_bytes(b"a small but valid UTF-8 text file. " * 200)  # 7 KB: one val block short
    (d / "notdb.db").write_text("this file is not an sqlite database")
    (d / "dangling.db").symlink_to(d / "gone" / "mlflow.db")  # a store link whose target was removed
    (d / "foreign").mkdir()
    import torch

    torch.save({"global_step": 4}, d / "foreign" / "step-4.ckpt")  # whole, but another config's
    (d / "corrupt").mkdir()
    (d / "corrupt" / "step-4.ckpt").write_bytes(b"PK\x03\x04 cut short")
    (d / "unlinked").mkdir()
    torch.save({"global_step": 4}, d / "unlinked" / "step-4.ckpt")
    (d / "foreign" / "run.json").write_text('{"run_id": "x", "config_hash": "0", "tracking_uri": "", "experiment": ""}')
    (d / "mixed").mkdir()  # a directory whose second file is not UTF-8
    (d / "mixed" / "a.txt").write_bytes(b"plain English text. " * 400)
    (d / "mixed" / "b.txt").write_bytes("caf\u00e9 ".encode("latin-1") * 400)
    (d / "userconf" / "pos").mkdir(parents=True)  # a user's option whose YAML does not parse
    (d / "userconf" / "pos" / "broken.yaml").write_text(
        "_target_: positional.rope.Rope\n_partial_: true\nbase: [1, 2\n"
    )
    (d / "nothing").mkdir()
    (d / "hidden" / ".git").mkdir(parents=True)  # only hidden files: nothing to read
    (d / "hidden" / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n" * 300)
    (d / "utf16.txt").write_bytes("plain English text. ".encode("utf-16") * 400)
    (d / "small.txt.gz").write_bytes(gzip.compress((d / "small.txt").read_bytes()))
    (d / "my dir").mkdir()
    (d / "my dir" / "fïle.txt").write_bytes(b"plain English text. " * 400)
    os.mkfifo(d / "fifo")  # reading it would block: refused before anything opens it
    (d / "e8").mkdir()
    (d / "e8" / "enwik8").write_bytes(b"x" * 1000)
    with zipfile.ZipFile(d / "enwik8.zip", "w") as z:
        z.writestr("enwik8", b"x" * 1000)
    with open(d / "zeros", "wb") as f:  # enwik8's size, sparse: the sha256 check is what refuses it
        f.truncate(100_000_000)
    tuned = {"pos=t5 attn=softmax": {"values": {"optim.optimizer.learning_rate": 1e-3}}}  # a key adamw lacks
    (d / "tuned.json").write_text(json.dumps({"cells": tuned}))
    bad = {"pos=rope attn=softmax": {"values": {"optim.optimizer.lr": -1}}}
    (d / "tuned_bad.json").write_text(json.dumps({"cells": bad}))
    from harness import integrity

    tuned = {"pos=rope attn=softmax": {"values": {"optim.optimizer.lr": 3e-4}}}
    integrity.write(d / "tuned_changed.json", {"cells": tuned})  # as results tune writes it, then a digit changed
    (d / "tuned_changed.json").write_text((d / "tuned_changed.json").read_text().replace("0.0003", "0.0008"))
    if wanted("export_"):
        _exports(d)
    if wanted("truncated.db"):
        _truncated_store(d / "truncated.db", empty_store)
    if wanted("flipped.db", "edited.db", "unkeyed.db"):
        _damaged_records(d, empty_store)
    if wanted("shards"):
        _shards(d)
    _sealed_report(d / "reports")
    if wanted("hf_"):
        _model_folders(d)
    if wanted("parquets", "notparquet"):
        _parquets(d)
    tuned = {"pos=rope attn=softmax": {"values": "abc"}}
    integrity.write(d / "tuned_string.json", {"cells": tuned})  # sealed as results tune seals, its values a string
    if wanted("another.db"):
        _another_projects_store(d / "another.db", empty_store)
    return d


def _named_by(rows: list | None):
    """wanted(*prefixes): whether a row of ``rows`` names a file of ``{files}`` starting with one of ``prefixes``
    (always, when ``rows`` is None: every row)."""
    if rows is None:
        return lambda *prefixes: True
    named = [arg.split("{files}/", 1)[1] for row in rows for arg in row[2] if "{files}/" in arg]
    return lambda *prefixes: any(name.startswith(prefixes) for name in named)


def _shards(d: Path) -> None:
    """Prepared shards of a small text, and copies each wrong in one way: a bit of an id flipped in place, the
    manifest edited; and shards of a learned vocabulary whose tokenizer.json was edited."""
    from harness.main import prepare_shards as prepare

    (d / "words.txt").write_bytes(b"alpha beta gamma delta " * 4600)  # 105,800 bytes: shards of ~100k ids
    prepare(d / "shards", ["data=text", f"data.path={d / 'words.txt'}"])
    shutil.copytree(d / "shards", d / "shards_rotted")
    shard = d / "shards_rotted" / "train-00000.bin"
    ids, stat = bytearray(shard.read_bytes()), shard.stat()
    ids[5_000] ^= 0x01  # one bit of one id, still inside the vocabulary; size and mtime kept: rot in place
    shard.write_bytes(bytes(ids))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    shutil.copytree(d / "shards", d / "shards_edited")
    manifest = json.loads((d / "shards_edited" / "manifest.json").read_text())
    manifest["splits"]["train"]["bytes"] += 1  # its seal kept: an edit by hand
    (d / "shards_edited" / "manifest.json").write_text(json.dumps(manifest))
    prepare(
        d / "shards_bpe", ["data=text", f"data.path={d / 'words.txt'}", "tokenizer=bpe", "tokenizer.vocab_size=300"]
    )
    vocabulary = d / "shards_bpe" / "tokenizer.json"
    vocabulary.write_text(vocabulary.read_text().replace('"alpha"', '"alphb"', 1))  # still JSON, still a vocabulary


def _model_folders(d: Path) -> None:
    """A tiny Llama folder as save_pretrained writes it (with a tokenizer), and copies each wrong in one way."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models

    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).save_pretrained(d / "hf_model")
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(d / "hf_model" / "tokenizer.json"))
    base = json.loads((d / "hf_model" / "config.json").read_text())

    def variant(name: str, config: object = None, keep: bool = True) -> Path:
        shutil.copytree(d / "hf_model", d / name) if keep else (d / name).mkdir()
        if config is not None:
            (d / name / "config.json").write_text(json.dumps(config))
        return d / name

    variant("hf_list", [], keep=False)
    for name, change in (
        ("hf_hidden_word", {"hidden_size": "abc"}),
        ("hf_hidden_negative", {"hidden_size": -32}),
        ("hf_heads_zero", {"num_attention_heads": 0}),
        ("hf_theta_word", {"rope_parameters": None, "rope_theta": "abc"}),
        ("hf_theta_negative", {"rope_parameters": None, "rope_theta": -5.0}),
        ("hf_theta_nan", {"rope_parameters": None, "rope_theta": float("nan")}),
        ("hf_partial_zero", {"partial_rotary_factor": 0}),
        ("hf_params_word", {"rope_parameters": "default"}),
        ("hf_type_unknown", {"rope_parameters": {"rope_type": "foo", "rope_theta": 10000.0}}),
        ("hf_layers_huge", {"num_hidden_layers": 100_000_000}),
        ("hf_type_model", {"model_type": "foo"}),
        ("hf_wrong_shape", {"vocab_size": 65}),
    ):
        variant(name, {k: v for k, v in {**base, **change}.items() if v is not None}, keep=name != "hf_list")
    from harness.data.tokenizer import ByteTokenizer
    from harness.pretrained.export import tokenizer_files

    other = variant("hf_other_tokenizer")
    for name, text in tokenizer_files(ByteTokenizer(), 64).items():  # ids up to 255: the model embeds 64
        (other / name).write_text(str(text))
    weights = (d / "hf_model" / "model.safetensors").read_bytes()
    (variant("hf_truncated") / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    flipped = bytearray(weights)
    flipped[12] ^= 0x20  # inside the JSON header
    (variant("hf_header_flipped") / "model.safetensors").write_bytes(bytes(flipped))
    (variant("hf_no_weights") / "model.safetensors").unlink()
    (variant("hf_bad_tokenizer") / "tokenizer.json").write_text("{not json")
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "hf_model" / "model.safetensors")
    tensors["model.norm.weight"][0] = float("nan")
    save_file(tensors, variant("hf_nan_weights") / "model.safetensors", metadata={"format": "pt"})


def _parquets(d: Path) -> None:
    """Two parquet files of one split whose schemas differ, and a .parquet that is not one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (d / "parquets").mkdir()
    pq.write_table(pa.table({"text": ["a text row, long enough. " * 40] * 50}), d / "parquets" / "a.parquet")
    pq.write_table(pa.table({"text": [1, 2, 3], "other": ["x", "y", "z"]}), d / "parquets" / "b.parquet")
    (d / "notparquet").mkdir()
    (d / "notparquet" / "train.parquet").write_bytes(b"PAR1 but cut short")


def _another_projects_store(path: Path, empty_store: Path) -> None:
    """A store whose paper-drope experiment holds another project's sweep (no pos tags on its runs)."""
    from mlflow.tracking import MlflowClient

    shutil.copyfile(empty_store, path)
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    experiment = client.create_experiment("paper-drope")
    parent = client.create_run(experiment, tags={"sweep_role": "parent", "sweep_id": "theirs"}).info.run_id
    client.create_run(experiment, tags={"mlflow.parentRunId": parent, "lr": "0.1"})


def _sealed_report(d: Path) -> None:
    """A report folder as its command seals it, then one character of its README changed."""
    from harness.integrity import seal_report

    (d / "grid").mkdir(parents=True)
    (d / "grid" / "README.md").write_text("# grid\n\n**Verdict: rope lower than t5 (p = 0.03)**\n")
    (d / "grid" / "report.csv").write_text("pos,final_val_loss\nrope,2.5\nt5,2.7\n")
    seal_report(d / "grid")
    readme = d / "grid" / "README.md"
    readme.write_text(readme.read_text().replace("0.03", "0.02"))


def _exports(d: Path) -> None:
    """A tiny model exported as export=hf writes it, three times: one bit of its weights flipped, its config edited,
    and written without its tokenizer."""
    from tests.helpers import tiny_export

    for name in ("export_flipped", "export_edited", "export_untokenized"):
        tiny_export(d / name)
    weights = bytearray((d / "export_flipped" / "model.safetensors").read_bytes())
    weights[-7] ^= 0x01
    (d / "export_flipped" / "model.safetensors").write_bytes(bytes(weights))
    config = d / "export_edited" / "config.json"
    config.write_text(config.read_text().replace('"rope_theta": 500.0', '"rope_theta": 5000.0'))


def _truncated_store(path: Path, empty_store: Path) -> None:
    """A store with a run, cut to half its size: the header still counts every page."""
    from mlflow.tracking import MlflowClient

    shutil.copyfile(empty_store, path)
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    client.create_run(client.create_experiment("posbench"))
    os.truncate(path, path.stat().st_size // 2)


def _damaged_records(d: Path, empty_store: Path) -> None:
    """A store with one sealed run (as a run closes), three times changed since: one bit of its loss flipped
    wherever the file holds it, a param edited, the seal's key damaged."""
    import struct

    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from harness.integrity import SEAL_TAG, seal

    loss = 1.2345678901234567
    shutil.copyfile(empty_store, d / "sealed.db")
    client = MlflowClient(tracking_uri=f"sqlite:///{d / 'sealed.db'}")
    run_id = client.create_run(
        client.create_experiment("posbench"),
        run_name="pos=rope attn=softmax seed=0",
        tags={"pos": "rope", "attn": "softmax", "seed": "0"},
    ).info.run_id
    client.log_batch(run_id, params=[Param("data.seq_len", "128")], metrics=[Metric("val/loss", loss, 1, 1)])
    client.set_terminated(run_id, "FINISHED")
    seal(client, run_id)
    for name in ("flipped", "edited", "unkeyed"):
        shutil.copyfile(d / "sealed.db", d / f"{name}.db")
    data, value = bytearray((d / "flipped.db").read_bytes()), struct.pack(">d", loss)
    for at in [i for i in range(len(data)) if data.startswith(value, i)]:
        data[at + 7] ^= 0x01
    (d / "flipped.db").write_bytes(bytes(data))
    for name, change in (
        ("edited", "UPDATE params SET value = '129'"),
        ("unkeyed", f"UPDATE tags SET key = 'posbench.sea1' WHERE key = '{SEAL_TAG}'"),
    ):
        with sqlite3.connect(d / f"{name}.db") as conn:
            conn.execute(change)


def row_request(row, files: Path, empty_store: Path, tmp: Path) -> dict:
    """The row as a command in ``tmp``, with its own copy of ``empty_store`` (a user's store exists before their
    mistake)."""
    entry, _, args, _ = row
    store = tmp / "mlflow.db"
    shutil.copyfile(empty_store, store)
    fill = {"files": files, "tmp": tmp, "store": f"sqlite:///{store}"}
    env = {
        "MLFLOW_TRACKING_URI": f"sqlite:///{store}",  # and a row's own environment: "ENV:NAME=VALUE"
        **dict(a.removeprefix("ENV:").split("=", 1) for a in args if a.startswith("ENV:")),
    }
    args = [a.format(**fill) for a in args if not a.startswith("ENV:")]
    if entry == "run":  # Hydra's flags (-m) before the overrides, as a user types them
        flags = [a for a in args if a.startswith("-")]
        argv = [*flags, *QUICK, f"hydra.run.dir={tmp}/run", *(a for a in args if not a.startswith("-"))]
        return {"argv": argv, "cwd": str(tmp), "env": env, "timeout": HANG}
    return {"argv": args, "module": entry, "cwd": str(tmp), "env": env, "timeout": HANG}


def run_count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("select count(*) from runs").fetchone()[0]


def runs_in(store: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("posbench")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def assert_one_line_error(code: int, stderr: str, needle: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-2000:]
    assert needle in lines[0], lines[0]
    assert any(w in lines[0] for w in ("; ", " use ", " must ", " add "))  # it says what to change
