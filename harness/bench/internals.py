"""What the bench room's modules build from the rest of the harness: a composed cell and its model, random
shards and their loader. A step's memory estimate is ``--check``'s own (harness/config/resources.py
``gpu_estimates``).
"""

from __future__ import annotations

import numpy as np
import torch

from attention.softmax import Softmax
from harness import integrity
from harness.config.load import load
from harness.config.resources import model_of
from harness.config.spec import RunSpec
from harness.data.loaders import make_loaders
from harness.data.objectives import CausalLM, MaskedLM
from harness.data.prepare import ShardWriter
from harness.data.shards import FORMAT, TokenShards
from harness.data.tokenizer import ByteTokenizer
from harness.errors import ConfigError
from harness.model.layers import unit_of_label
from harness.model.transformer import Transformer
from positional.base import Shape


def compose_cell(overrides: list[str]) -> RunSpec:
    """The run ``python run.py <overrides>`` describes (harness/config/load.py)."""
    return load(overrides, multirun=True)  # a cell of a preset may leave its sweep axes (seed) to the caller


def option_overrides(group: str, name: str) -> list[str]:
    """``pos=rope``; for a per-layer pattern's name (``rope×3+none``) its first option and the pattern,
    ``pos=rope +pos.layers=[rope,rope,rope,none]`` (harness/model/layers.py)."""
    unit = unit_of_label(name)
    if len(unit) == 1 and "(" not in name:
        return [f"{group}={name}"]
    first = unit[0].partition("(")[0]
    quoted = [f"'{entry}'" if "(" in entry else entry for entry in unit]  # Hydra's grammar: settings in quotes
    return [f"{group}={first}", f"+{group}.layers=[{','.join(quoted)}]"]


def build_transformer(overrides: list[str], vocab_size: int, seq_len: int, causal: bool) -> Transformer:
    """posbench's model for one composed config, built as harness.train builds it."""
    return model_of(compose_cell(overrides), vocab_size, seq_len, causal)


def composed_model(spec: RunSpec, vocab_size: int, causal: bool, device: str = "meta") -> Transformer:
    """posbench's model for a spec at its ``data.seq_len``, as harness.train builds it, on ``device`` (``meta``:
    laid out, no memory)."""
    with torch.device(device):
        return model_of(spec, vocab_size, spec.data.seq_len, causal)


def xformers_refusal() -> str | None:
    """What ``attn.backend=xformers`` says where it cannot run (None where it builds)."""
    try:
        Softmax(Shape(64, 4, 1, 128, True), backend="xformers")
    except ConfigError as e:
        return str(e)
    return None


def write_random_shards(folder, n_tokens: int, seed: int = 0) -> None:
    """Random uint16 ids in one training shard (and a small validation one), with a byte-tokenizer manifest: a
    ``data=tokens`` folder of ``n_tokens`` ids (the loader bench's corpus)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    writers = {
        "train": ShardWriter(folder, "train", np.dtype(np.uint16), n_tokens),
        "val": ShardWriter(folder, "val", np.dtype(np.uint16), n_tokens),
    }
    step = 1 << 26
    for start in range(0, n_tokens, step):
        ids = rng.integers(0, 256, min(step, n_tokens - start), dtype=np.uint16)
        writers["train"].write(ids, len(ids))
    writers["val"].write(rng.integers(0, 256, 1 << 16, dtype=np.uint16), 1 << 16)
    splits = {k: w.close() for k, w in writers.items()}
    manifest = {
        "format": FORMAT,
        "corpus": {"name": "random", "sha256": "0" * 64, "bytes": n_tokens, "train_sha256": "0" * 64},
        "tokenizer": {"config": "byte", "digest": ByteTokenizer().digest(), "vocab_size": 258, "recipe": None},
        "dtype": "uint16",
        "block_bytes": writers["train"].block_bytes,
        "splits": splits,
    }
    integrity.write(folder / "manifest.json", manifest)  # as prepare writes it: checked on read


def shard_loader(folder, objective: str, windows: str, seq_len: int, batch_size: int, n_batches: int, workers: int = 0):
    """The training DataLoader a run builds over a shard folder (``make_loaders``), byte tokenizer."""
    source = TokenShards(str(folder), windows)
    source.sizes()  # what validation checks: the manifest and every shard's size
    task = (MaskedLM if objective == "mlm" else CausalLM)(ByteTokenizer())
    train, _ = make_loaders(
        source.load(), task, seq_len, batch_size, n_train=n_batches * batch_size, seed=0, num_workers=workers
    )
    return train
