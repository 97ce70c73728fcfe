"""One flipped bit in each file posbench writes and later reads back, at spread-out places, each read by the function
the command that uses the file calls: is every one refused before its content is used?

    python tools/damage_round.py            # ~1 min on 2 cores; prints each try that was not refused, then counts

Each kind below is built once as the harness writes it (``prepare`` for shards, their manifest and vocabulary; the
checkpoint callback for a checkpoint and the run link; the embedded corpus and a trained vocabulary in a cache;
``sealed.write`` for best.json; the export's own files; a report folder's SHA256SUMS; a sweep's record), then for each
of ``PLACES`` offsets spread over the file (first byte to last) a copy has the bit ``offset mod 8`` of that byte
flipped and is read by the kind's reader. A try is

  refused    a ConfigError in one line that names the damaged file (or, for a seal, the file it seals)
  accepted   the reader returned: the damage went unseen
  other      any other exception (a traceback for the user)

A shard folder is read twice: hashed whole at the start (a folder of at most $POSBENCH_HASH_WHOLE_BYTES), and block
by block as its reads reach each block (a larger one; here by setting that limit to 0). The MLflow store is left out:
most bytes of an sqlite file are page structure and free space, where a flip changes no value; each kind of value a
run record holds is damaged one by one in tests/unit/test_run_seal.py instead.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PLACES = 16  # offsets per file: 0, len/15, 2·len/15, …, the last byte; a file of at most EVERY bytes: each byte
EVERY = 4096


@dataclass
class Kind:
    name: str
    folder: Path  # as the harness wrote it; each try damages a copy
    target: str  # the file to damage, relative to ``folder``
    read: Callable[[Path], object]  # reads a copy of the folder as the command that uses it does


def _words(folder: Path) -> Path:
    text = "".join(f"Line {i}: positions {i % 13} and attention {i % 7} in a transformer.\n" for i in range(3000))
    (folder / "words.txt").write_text(text)
    return folder / "words.txt"


def build(root: Path) -> list[Kind]:
    """Every kind's folder under ``root``, written by the harness's own writers."""
    import torch

    from harness import sealed
    from harness.config.tuned import tuned_values
    from harness.data import corpus as corpus_module
    from harness.data.corpus import Embedded, TextFiles
    from harness.data.shards import TokenShards
    from harness.data.subword import BPE
    from harness.main import prepare_shards as prepare
    from harness.record.callbacks import CommittedCheckpoints
    from harness.record.checkpoints import RunLink, checkpoint_step, latest_checkpoint
    from harness.sweep.callback import SweepRecord

    kinds: list[Kind] = []
    root.mkdir(parents=True)
    words = _words(root)

    shards = root / "shards"
    prepare(shards / "f", ["data=text", f"data.path={words}"], shard_tokens=40_000)

    def whole(folder: Path):
        import harness.data.shards as module

        module._VERIFIED.clear()
        return TokenShards(str(folder / "f")).sizes()

    def by_block(folder: Path):
        os.environ["POSBENCH_HASH_WHOLE_BYTES"] = "0"
        try:
            loaded = TokenShards(str(folder / "f")).load()
            for ids in (loaded.train_ids, loaded.val_ids):
                for start in range(0, len(ids), 4096):  # every window a run could read
                    ids[start:start + 4096]
        finally:
            del os.environ["POSBENCH_HASH_WHOLE_BYTES"]

    kinds += [Kind("shard, hashed whole", shards, "f/train-00001.bin", whole),
              Kind("shard, by block", shards, "f/train-00001.bin", by_block),
              Kind("manifest.json", shards, "f/manifest.json", whole)]

    bpe = root / "bpe"
    cache = root / "cache"
    corpus_module.CACHE = cache
    prepare(bpe / "f", ["data=text", f"data.path={words}", "tokenizer=bpe", "tokenizer.vocab_size=300"])
    kinds.append(Kind("a prepared folder's tokenizer.json", bpe, "f/tokenizer.json",
                      lambda f: BPE(vocab_size=300).fit(TokenShards(str(f / "f")).load())))

    def in_cache(folder: Path, read):
        corpus_module.CACHE = folder / "c"
        return read()

    corpus_cache = root / "corpus_cache"
    corpus_module.CACHE = corpus_cache / "c"
    Embedded().load()
    Embedded().document_starts()
    text = next((corpus_cache / "c").glob("stdlib-prose-*.txt")).name
    starts = next((corpus_cache / "c").glob("*.starts.npy")).name
    kinds += [Kind("the embedded corpus cache", corpus_cache, f"c/{text}", lambda f: in_cache(f, Embedded().load)),
              Kind("its seal", corpus_cache, f"c/{text}.sha256", lambda f: in_cache(f, Embedded().load)),
              Kind("the document starts cache", corpus_cache, f"c/{starts}",
                   lambda f: in_cache(f, Embedded().document_starts))]

    vocab_cache = root / "vocab_cache"
    corpus_module.CACHE = vocab_cache / "c"
    text_corpus = TextFiles(str(words)).load()
    BPE(vocab_size=300).fit(text_corpus)
    vocabulary = next((vocab_cache / "c" / "tokenizers").glob("bpe-v300-*.json")).name
    kinds += [Kind("a cached vocabulary", vocab_cache, f"c/tokenizers/{vocabulary}",
                   lambda f: in_cache(f, lambda: BPE(vocab_size=300).fit(text_corpus))),
              Kind("its seal", vocab_cache, f"c/tokenizers/{vocabulary}.sha256",
                   lambda f: in_cache(f, lambda: BPE(vocab_size=300).fit(text_corpus)))]

    class Trainer:  # what the checkpoint callback reads of Lightning's trainer
        is_global_zero, global_step = True, 4

        def save_checkpoint(self, path):
            torch.save({"global_step": 4, "weights": torch.arange(5_000.0)}, path)

    checkpoints = root / "checkpoints"
    checkpoints.mkdir()
    callback = CommittedCheckpoints(checkpoints, every=4, flush=lambda: None)
    callback.on_train_batch_end(Trainer(), None, None, None, 0)
    callback.on_train_batch_start(Trainer(), None, None, 0)
    RunLink("0123abcd", "f" * 16, "sqlite:////tmp/mlflow.db", "posbench").save(checkpoints)
    kinds += [Kind("a checkpoint", checkpoints, "step-4.ckpt", lambda f: checkpoint_step(latest_checkpoint(f))),
              Kind("its seal", checkpoints, "step-4.ckpt.sha256", lambda f: checkpoint_step(latest_checkpoint(f))),
              Kind("run.json", checkpoints, "run.json", RunLink.load)]

    sweep = root / "sweep"
    sweep.mkdir()
    SweepRecord("0123abcd", "20261127-000000-abcd", "sqlite:////tmp/mlflow.db", "posbench", ["pos"]).save(sweep)
    kinds.append(Kind("mlflow_sweep.json", sweep, "mlflow_sweep.json", SweepRecord.load))

    tuned = root / "tuned"
    tuned.mkdir()
    sealed.write(tuned / "best.json", {"cells": {"pos=rope attn=softmax": {"values": {"optim.optimizer.lr": 3.5e-4}}}})
    kinds.append(Kind("best.json", tuned, "best.json", lambda f: tuned_values(str(f / "best.json"), "rope", "softmax")))

    export = root / "export"
    _export(export)
    fix = "export the model again"
    kinds += [Kind("an export's model.safetensors", export, "model.safetensors", lambda f: sealed.check_folder(f, fix)),
              Kind("an export's config.json", export, "config.json", lambda f: sealed.check_folder(f, fix)),
              Kind("its seal", export, "config.json.sha256", lambda f: sealed.check_folder(f, fix))]

    report = root / "report"
    report.mkdir()
    (report / "README.md").write_text("# grid\n\n**Verdict: rope lower than t5 (p = 0.03)**\n" + "text\n" * 40)
    (report / "report.csv").write_text("pos,final_val_loss\nrope,2.5\nt5,2.7\n")
    (report / "plot.png").write_bytes(bytes(range(256)) * 16)
    sealed.seal_report(report)
    for name in ("README.md", "plot.png", sealed.SUMS):
        kinds.append(Kind(f"a report folder's {name}", report, name,
                          lambda f: sealed.check_report(f, "run its command again", needs=["README.md"])))
    return kinds


def _export(folder: Path) -> None:
    import torch

    from attention.softmax import Softmax
    from harness.model.transformer import ModelConfig, Transformer
    from harness.pretrained.export import hf_files
    from positional.rope import Rope

    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, d_ff=48, dropout=0.0, norm_type="rmsnorm", mlp="swiglu",
                      bias=False, head="untied")
    model = Transformer(cfg, 61, 16, True, lambda s: Rope(s, base=500.0), Softmax).eval()
    folder.mkdir()
    for name, content in hf_files(model, 61, 16, causal=True).items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())


def places(path: Path) -> int:
    return path.stat().st_size if path.stat().st_size <= EVERY else PLACES


def flip(path: Path, place: int) -> int:
    data = bytearray(path.read_bytes())
    at = place if len(data) <= EVERY else round(place * (len(data) - 1) / (PLACES - 1))
    data[at] ^= 1 << (place % 8)
    path.write_bytes(bytes(data))
    return at


def one_try(kind: Kind, place: int, scratch: Path) -> tuple[str, str]:
    from harness.errors import ConfigError

    copy = scratch / "try"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(kind.folder, copy)
    target = copy / kind.target
    at = flip(target, place)
    sealed_file = target.name.removesuffix(".sha256")
    try:
        kind.read(copy)
    except ConfigError as e:
        line = str(e)
        named = target.name in line or sealed_file in line
        return ("refused" if named and "\n" not in line else "other"), f"byte {at}: {line[:160]}"
    except Exception as e:  # noqa: BLE001 (what the round counts)
        return "other", f"byte {at}: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    return "accepted", f"byte {at}"


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="damage-round-"))
    try:
        kinds = build(root / "built")
        counts: Counter[str] = Counter()
        for kind in kinds:
            outcomes = Counter()
            for place in range(places(kind.folder / kind.target)):
                outcome, detail = one_try(kind, place, root)
                outcomes[outcome] += 1
                if outcome != "refused":
                    print(f"{outcome:9} {kind.name} ({kind.target}) {detail}")
            counts.update(outcomes)
            print(f"{kind.name:36} {kind.target:34} " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" (of {sum(counts.values())} tries, "
              f"{len(kinds)} kinds)")
        return 0 if set(counts) == {"refused"} else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
