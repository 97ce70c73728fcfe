"""Helpers the tests share: the checkout's root, the tiny model settings, composing the real Hydra config,
running a sweep in a subprocess, and decoding the PNG figures a run writes.

A plain module, imported as ``tests.helpers`` by conftest.py and the test files alike: importing
conftest from a test made pytest's ``conftest`` and ``tests.conftest`` two modules with their own state.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The hang guard of every real process a test starts: a limit that only a hung process reaches, on a busy machine
# too (a test asserts what a command did, never how fast: timings belong in the benchmarks).
HANG = 1800

# Tiny but real: every end-to-end test trains through the same code path as run.py.
TINY = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "data.seq_len=32",
    "data.batch_size=8",
    "data.eval_batches=2",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
    "optim.schedule.warmup_steps=2",
]


def compose(overrides: list[str] = ()):
    """The composed config, hydra node included (tests read hydra.runtime.choices)."""
    from harness.config.load import compose as harness_compose

    return harness_compose(overrides, hydra=True)


def choices_of(cfg) -> dict[str, str]:
    return {g: cfg.hydra.runtime.choices[g] for g in ("pos", "attn", "task", "data")}


def spec(*overrides: str):
    """The RunSpec of TINY plus ``overrides`` (harness.config.load), as a run starts."""
    from harness.config.load import load

    return load([*TINY, *overrides])


def validated(*overrides: str, gpu=None):
    """``check(load(TINY + overrides))`` (``gpu``: checked for a named GPU, as ``--check --gpu-memory``): its
    Checked."""
    from harness.config.check import check

    return check(spec(*overrides), gpu)


def tiny_trainer(uri: str):
    """train(*overrides) -> (Summary, MlflowClient): TINY plus ``overrides``, recorded in the store at ``uri``."""
    from mlflow.tracking import MlflowClient

    from harness.train import train

    def run(*overrides: str):
        return train(spec(*overrides)), MlflowClient(tracking_uri=uri)

    return run


def headers_only(folder, config: dict) -> None:
    """A model.safetensors whose header holds the input embedding (a sparse file: its data takes no disk) and an
    empty tokenizer.json: what --check reads of a folder, without gigabytes of weights."""
    import json

    shape = [config["vocab_size"], config["hidden_size"]]
    header = json.dumps(
        {"model.embed_tokens.weight": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * shape[0] * shape[1]]}}
    ).encode()
    with (folder / "model.safetensors").open("wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + 4 * shape[0] * shape[1])
    (folder / "tokenizer.json").write_text("{}")


def connections(monkeypatch) -> list:
    """Every address this process tries to connect to from now on (the test's monkeypatch undoes it): a check that
    gives up at once tries one, however busy the machine."""
    import socket

    tried: list = []
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def counted(real):
        def attempt(self, address):
            tried.append(address)
            return real(self, address)

        return attempt

    monkeypatch.setattr(socket.socket, "connect", counted(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", counted(connect_ex))
    return tried


@dataclass
class SweepResult:
    """A `python run.py -m ...` subprocess run into its own store, read back from MLflow."""

    uri: str
    sweep_dir: Path
    proc: subprocess.CompletedProcess
    client: object  # MlflowClient
    parent: object | None  # mlflow Run
    children: list

    def child(self, pos: str):
        return next(r for r in self.children if r.data.tags["pos"] == pos)


def run_sweep(tmp: Path, *overrides: str, in_process: bool = False) -> SweepResult:
    """``python run.py -m TINY OVERRIDES`` recording into ``tmp``/mlflow.db (the ``store`` fixture's migrated empty
    store, when the test asks for it): a real process, or, for a test about what a sweep records rather than about
    its process, run.py's entry function in this interpreter (``in_process``: tests/inprocess.py)."""
    from mlflow.tracking import MlflowClient

    from tests import inprocess

    uri, sweep_dir = f"sqlite:///{tmp / 'mlflow.db'}", tmp / "multirun"
    argv = ["-m", *TINY, *overrides, f"hydra.sweep.dir={sweep_dir}"]
    if in_process:
        done = inprocess.run("run", argv, str(ROOT), {"MLFLOW_TRACKING_URI": uri}, timeout=HANG)
        proc = subprocess.CompletedProcess(["run.py", *argv], done["code"], done["stdout"], done["stderr"])
    else:
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
        proc = subprocess.run(
            [sys.executable, "run.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG
        )
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("posbench")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    parent = next((r for r in runs if r.data.tags.get("sweep_role") == "parent"), None)
    children = [r for r in runs if r is not parent]
    return SweepResult(uri, sweep_dir, proc, client, parent, children)


# --- figures ------------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_figure(
    png: bytes | str | Path, min_size: tuple[int, int] = (100, 100), min_colours: int = 8, min_drawn: float = 0.005
) -> np.ndarray:
    """Decodes a PNG and checks it holds a drawn picture, not an empty canvas: at least ``min_size``
    (height, width) pixels, ``min_colours`` distinct colours (a plot's lines, text and antialiasing make
    dozens), and ``min_drawn`` of its pixels differing from the most common colour (the background).
    Returns the (H, W, C) uint8 image for further checks."""
    from PIL import Image  # matplotlib's own PNG dependency

    data = png if isinstance(png, bytes) else Path(png).read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"not a PNG: starts {data[:8]!r}"
    with Image.open(io.BytesIO(data)) as im:
        im.load()  # decodes every row: a truncated or corrupt file raises here
        pixels = np.asarray(im.convert("RGBA"))  # (H, W, 4)
    height, width = pixels.shape[:2]
    assert height >= min_size[0] and width >= min_size[1], f"{width}×{height} px, want ≥ {min_size[1]}×{min_size[0]}"
    colours, counts = np.unique(pixels.reshape(-1, 4), axis=0, return_counts=True)
    assert len(colours) >= min_colours, f"{len(colours)} distinct colours: a blank or flat image"
    drawn = 1 - counts.max() / counts.sum()
    assert drawn >= min_drawn, f"only {drawn:.2%} of the pixels differ from the background"
    return pixels


def rope_args(scaling: str = "none", **kw) -> dict:
    """Rope's (or RopeTrainable's) keyword arguments from the flat form the RoPE tests write,
    ``scaling="yarn", factor=4.0, fraction=0.5``: the RopeScaling fields become one partial RopeScaling, as
    conf/pos/scaling/<method>.yaml builds it, so its errors come worded as Rope's (``scaling.factor=…``)."""
    from positional.rope_scaling import RopeScaling

    fields = {f.name for f in dataclasses.fields(RopeScaling)}
    options = {k: v for k, v in kw.items() if k in fields}
    return {
        **{k: v for k, v in kw.items() if k not in fields},
        "scaling": functools.partial(RopeScaling, method=scaling, **options),
    }


def gemma3():
    """A 4-layer Gemma 3 text config at TINY's size: three sliding-window layers at θ = 10k, one global at θ = 1M."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=258,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=16,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
    )


def tiny_llama(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (GQA, 4 heads, 2 key/value heads) saved to ``folder`` with posbench's byte tokenizer (as an
    export writes it, without seals): a pretrained model for hf-eval's tests."""
    import json

    import torch
    import transformers

    from harness.data.tokenizer import ByteTokenizer
    from harness.pretrained.export import tokenizer_files

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    on_disk = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**on_disk, "posbench_tokenizer": "byte"}))
    for name, text in tokenizer_files(ByteTokenizer(), 64).items():
        (folder / name).write_text(str(text))
    return folder


def tiny_export(folder: Path, tokenizer=None) -> Path:
    """A 1-layer modern-block causal LM (RoPE, base 500) as ``export=hf`` writes it, seals included, into a new
    ``folder``: the same weights every call (its own seed; the global generator is left as it was)."""
    import torch

    from attention.softmax import Softmax
    from harness.model.transformer import ModelConfig, Transformer
    from harness.pretrained.export import hf_files
    from positional.rope import Rope

    modern = dict(norm_type="rmsnorm", mlp="swiglu", bias=False, head="untied")
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, d_ff=48, dropout=0.0, **modern)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Transformer(cfg, 61, 16, True, lambda s: Rope(s, base=500.0), Softmax).eval()
    folder.mkdir()
    for name, content in hf_files(model, 61, 16, causal=True, tokenizer=tokenizer).items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return folder


DDP_CPU = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]  # two ranks on this CPU (gloo)
