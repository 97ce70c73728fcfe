"""posbench as a user installs it: a plain (non-editable) ``pip install .`` into a fresh virtual environment,
then the ``posbench`` command and ``python -m results`` from a directory that is not the checkout.

The fresh environment reuses the packages of the environment running the tests (torch, lightning, ...: no
network) through a ``.pth`` file that adds that environment's site directories after its own. Not
``--system-site-packages``: a venv made from inside another venv sees the *base* interpreter's packages, not
the outer venv's (../shared/FACTS.md), so the test passed where packages were installed into the machine's
interpreter and failed in every newcomer's venv. Those directories also hold the checkout's editable install;
the first test checks that the copy imported is the installed one. The outer environment's pip and setuptools
(the ``test`` extra's) build and install it; pip builds in a copy of the sources, never in the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import HANG, ROOT, TINY
from tests.user_package import write_user_package

HEAVY = {"lightning", "pytorch_lightning", "mlflow", "hydra", "omegaconf"}
HYDRA_FULL = "HYDRA_FULL_ERROR"


def pyproject() -> dict:
    from setuptools.config.pyprojecttoml import read_configuration  # tomllib is Python 3.11+

    return read_configuration(ROOT / "pyproject.toml", expand=False)


@dataclass
class Installed:
    python: Path  # the environment's interpreter
    posbench: Path  # its console script
    site: Path  # its site-packages
    cwd: Path  # where the commands run: neither the checkout nor the environment
    sweep_output: str = ""  # what the trained fixture's sweep printed

    def run(self, *argv: str | Path, **env: str) -> subprocess.CompletedProcess:
        """``argv`` in ``cwd``, with none of the checkout's settings; ``env``: the user's own (PYTHONPATH)."""
        kept = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI", HYDRA_FULL)}
        return subprocess.run(
            [str(a) for a in argv],
            cwd=self.cwd,
            env={**kept, **env},
            capture_output=True,
            text=True,
            timeout=HANG,
        )

    @property
    def user(self) -> dict[str, str]:
        """The environment of a user whose package (mypkg, tests/user_package.py) is on PYTHONPATH."""
        return {"PYTHONPATH": str(self.cwd)}


def copy_sources(dest: Path) -> Path:
    """pyproject.toml, README.md and the top-level folders its package list names, without build debris."""
    config = pyproject()
    tops = {name.split(".")[0] for name in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    dest.mkdir()
    for name in ("pyproject.toml", config["project"]["readme"]):
        shutil.copy2(ROOT / name, dest / name)
    for top in sorted(tops):
        shutil.copytree(ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def fresh_venv(venv: Path) -> Path:
    """A venv with no packages of its own that sees this environment's, after its own site-packages; its python."""
    import site

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    outer = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    # addsitedir, not a bare path: the outer .pth files (the checkout's editable install among them) apply too
    (own / "zz_outer_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dict.fromkeys(outer) if Path(d).is_dir())
    )
    return python


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("install")
    src = copy_sources(base / "src")
    venv = base / "venv"
    python = fresh_venv(venv)
    # the outer pip and setuptools, seen through the .pth, build and install into the fresh venv (sys.prefix);
    # --ignore-installed: the checkout's editable posbench, seen the same way, is not the venv's to uninstall
    done = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--ignore-installed",
            "--disable-pip-version-check",
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    cwd = write_user_package(base / "elsewhere")  # the user's own package and config dir are where they work
    return Installed(python, venv / "bin" / "posbench", site, cwd)


@pytest.fixture(scope="module")
def trained(installed, replies) -> Installed:
    """A two-cell sweep, no store named: the store, outputs and multirun must land in the working directory.
    Its axis is a class of the user's package beside a built-in's, named by ``pos._target_`` (README, "Your own
    scheme"): the cells must be named after the classes and compared like any two options. It is the first of the
    replies fixture's commands (``posbench -m …``, the installed copy's entry function in its interpreter), so the
    other commands read its store; the console script's own process is pinned by the tests that start it.
    (A single run starts the same way, through harness/main.py; tests/process/test_cli.py trains one.)"""
    sweep = replies[f"posbench {' '.join(SWEEP)}"]
    assert sweep["code"] == 0, sweep["stdout"] + sweep["stderr"]
    installed.sweep_output = sweep["stdout"] + sweep["stderr"]
    return installed


def test_import_positional_and_attention_without_the_harness_stack():
    """The maths rooms are a library: importing them loads no Lightning, MLflow, Hydra or OmegaConf."""
    code = (
        "import sys, positional, attention\n"
        "from positional import Rope, ALiBi, T5Bias, PositionalScheme, Shape\n"
        "from attention import Softmax, Local, Performer, Linear, AttentionVariant, AttentionContext\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    assert not HEAVY & set(done.stdout.split())
    import attention
    import positional

    for package in (positional, attention):
        assert package.__doc__.startswith("Room:")
        assert all(hasattr(package, name) for name in package.__all__)


def test_the_installed_copy_is_imported_and_finds_its_conf(installed):
    code = (
        "import harness, positional, attention, results, hydra_plugins.posbench_sweeper as plugin\n"
        "from harness.paths import CONF, project_root\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.sweeper import Sweeper\n"
        "names = {p.__module__ for p in Plugins.instance().discover(Sweeper)}\n"
        "for m in (harness, positional, attention, results, plugin): print(m.__file__)\n"
        "print(CONF / 'config.yaml'); print(project_root()); print('hydra_plugins.posbench_sweeper' in names)"
    )
    done = installed.run(installed.python, "-c", code)
    assert done.returncode == 0, done.stderr
    *files, config, root, discovered = done.stdout.split("\n")[:-1]
    for file in [*files, config]:
        assert Path(file).is_relative_to(installed.site), file  # not the checkout's editable install
    assert Path(config).is_file()
    assert Path(root) == installed.cwd  # runs write here, not into site-packages
    assert discovered == "True"  # Hydra finds the sweeper of experiment=tune_lr in the installed namespace


def test_posbench_matrix_from_another_directory(replies):
    done = replies["posbench --matrix"]  # the installed copy's entry function, in its interpreter, elsewhere
    assert done["code"] == 0, done["stderr"]
    assert "rope" in done["stdout"] and "softmax" in done["stdout"]


def test_posbench_check_composes_from_the_installed_conf(installed, replies):
    done = replies[f"posbench {' '.join(CHECKED)}"]  # the installed copy's entry function, in its interpreter
    assert done["code"] == 0, done["stdout"] + done["stderr"]
    assert "ok: pos=t5 attn=local" in done["stdout"]
    assert f"store sqlite:///{installed.cwd / 'mlflow.db'}" in done["stdout"]
    refused = installed.run(installed.posbench, "--check", "pos=nope")  # the console script's exit status
    assert refused.returncode == 2 and refused.stderr.startswith("error: "), refused.stderr


def test_posbench_trains_into_the_working_directory(trained):
    from mlflow.tracking import MlflowClient

    db = trained.cwd / "mlflow.db"
    assert db.is_file() and (trained.cwd / "multirun").is_dir()
    assert not (trained.site / "mlflow.db").exists() and not (trained.site / "multirun").exists()
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("posbench").experiment_id])
    cells = {r.data.tags["pos"]: r for r in runs if "pos" in r.data.tags}
    assert set(cells) == {"rope", "decay"}
    assert cells["decay"].data.params["pos._target_"] == "mypkg.decay.Decay"
    assert {r.info.status for r in runs} == {"FINISHED"}  # both cells and the sweep's parent run
    version = pyproject()["project"]["version"]
    assert cells["rope"].data.tags["git_sha"] == f"installed {version}"  # not the commit of a repository around it


def test_results_commands_read_the_store_of_the_working_directory(trained, replies):
    helped = trained.run(trained.python, "-m", "results", "--help")  # python -m results itself (imports nothing)
    assert helped.returncode == 0 and "report" in helped.stdout and "paper" in helped.stdout, helped.stderr
    done = replies["results report --out results/posbench"]
    assert done["code"] == 0, done["stdout"] + done["stderr"]
    report = (trained.cwd / "results" / "posbench" / "report.md").read_text()
    assert "pos=decay" in report and "pos=rope" in report
    assert "`pos=rope`, declared before the sweep ran (report.baseline)" in report  # read back from the parent run
    assert "--out results/posbench/`" in report  # the regenerate line, relative to the working directory


# ---------------------------------------------------------------- every documented route, from the installed copy

# The commands below are read back from one interpreter of the installed environment (the replies fixture, as the
# README's lines): what they print and return. The console script itself, a fresh interpreter's imports and a
# user's environment read at import are pinned by the tests above and below that start their own process.
# {conf}: the user's config dir; {home}: the working directory, where the user's package lies.

CONFIG_DIR_ANYWHERE = {
    "cd-matrix": ["--config-dir", "{conf}", "--matrix"],  # CONTRIBUTING's own command
    "matrix-cd": ["--matrix", "--config-dir", "{conf}"],
    "cd=-matrix=md": ["--config-dir={conf}", "--matrix=md"],
    "cd-list": ["--config-dir", "{conf}", "--list"],
    "cd-short-list=md": ["-cd", "{conf}", "--list=md"],
    "list-searchpath": ["--list", "hydra.searchpath=[file://{conf}]"],
}
CHECKED_WITH_THE_USERS_CLASS = [  # argv, the lines it prints
    (["--check", "--config-dir", "{conf}", "pos=decay", "attn=performer"], ["ok: pos=decay attn=performer"]),
    (["--config-dir", "{conf}", "--check", "-m", "pos=none,decay", *TINY], ["ok: pos=none", "ok: pos=decay"]),
    (["--config-dir", "{conf}", "--check", "pos._target_=mypkg.decay.Decay"], ["ok: pos=decay attn=softmax"]),
]
REFUSED_LIKE_A_BUILT_IN = {
    "own-error-as-key": (  # the scheme's own error, worded by its key
        ["--check", "--config-dir", "{conf}", "pos=decay", "pos.init=-1", *TINY],
        "error: pos.init=-1 must be positive",
    ),
    "unknown-key-of-class": (
        ["--check", "pos._target_=mypkg.decay.Decay", "+pos.nope=1", *TINY],
        "pos.nope is not a setting of pos=decay",
    ),
    "class-not-importable": (
        ["--check", "pos._target_=mypkg.nothere.Decay", *TINY],
        "pos._target_='mypkg.nothere.Decay' cannot be imported",
    ),
}
CHECKED = ["--check", "pos=t5", "attn=local"]
PREPARED = ["prepare", "shards", "data=text", "data.path={home}/corpus.txt"]
TRAINED_ON_THE_SHARDS = ["--check", "data=tokens", "data.path=shards", *TINY]
SWEEP = [  # the trained fixture's: no store named
    "-m",
    *TINY,
    "checkpoint.every_n_steps=0",
    "report.baseline=rope",
    "pos._target_=positional.rope.Rope,mypkg.decay.Decay",
]
OWN_COMMANDS = [  # (entry, argv) in the order they run: the sweep, then the report on its store alone
    ("posbench", SWEEP),
    ("results", ["report", "--out", "results/posbench"]),
    ("posbench", CHECKED),
    ("posbench", ["--matrix"]),
    *(("posbench", argv) for argv in CONFIG_DIR_ANYWHERE.values()),
    ("posbench", ["--list", "pos._target_=mypkg.decay.Decay"]),
    ("posbench", ["pos._target_=mypkg.decay.Decay", "--matrix"]),
    *(("posbench", argv) for argv, _ in CHECKED_WITH_THE_USERS_CLASS),
    *(("posbench", argv) for argv, _ in REFUSED_LIKE_A_BUILT_IN.values()),
    ("posbench", PREPARED),
    ("posbench", TRAINED_ON_THE_SHARDS),  # after PREPARED: it reads its shards
]


def test_a_class_named_by_target_is_compared_with_a_built_in_in_its_sweep(trained):
    """pos._target_ cells are one axis (the class's name), not two variants with nothing to compare; the user's
    class is compared with the baseline the sweep declared (report.baseline=rope), whichever trained better."""
    assert "nothing to compare" not in trained.sweep_output and "No verdict" not in trained.sweep_output
    verdicts = [line.strip() for line in trained.sweep_output.splitlines() if " vs " in line]
    assert len(verdicts) == 1 and verdicts[0].startswith("decay vs rope (softmax): "), trained.sweep_output[-3000:]


@pytest.mark.parametrize("argv", CONFIG_DIR_ANYWHERE.values(), ids=CONFIG_DIR_ANYWHERE.keys())
def test_matrix_and_list_take_the_users_config_dir_in_any_position(replies, argv):
    done = replies[f"posbench {' '.join(argv)}"]
    assert done["code"] == 0, done["stderr"]
    assert any(line.lstrip("| `").startswith("decay") for line in done["stdout"].splitlines()), done["stdout"]


def test_list_and_matrix_show_a_class_named_by_target(replies):
    listed = replies["posbench --list pos._target_=mypkg.decay.Decay"]
    assert listed["code"] == 0, listed["stderr"]
    assert "Learned linear decay" in listed["stdout"] and "bias: relative" in listed["stdout"]
    paired = replies["posbench pos._target_=mypkg.decay.Decay --matrix"]
    row = next(line for line in paired["stdout"].splitlines() if line.startswith("decay "))
    assert paired["code"] == 0 and row.split()[1:] == ["ok"] * 4  # a relative bias: every variant takes it


def test_check_takes_the_users_config_dir_and_class(replies):
    for argv, said in CHECKED_WITH_THE_USERS_CLASS:  # a single cell, a sweep's cells, a class named by _target_
        done = replies[f"posbench {' '.join(argv)}"]
        assert done["code"] == 0 and all(line in done["stdout"] for line in said), done["stdout"] + done["stderr"]


@pytest.mark.parametrize("argv, line", REFUSED_LIKE_A_BUILT_IN.values(), ids=REFUSED_LIKE_A_BUILT_IN.keys())
def test_the_users_scheme_is_refused_in_one_line_like_a_built_in(replies, argv, line):
    done = replies[f"posbench {' '.join(argv)}"]
    assert done["code"] == 2 and done["stderr"].count("\n") == 1 and line in done["stderr"], done["stderr"]


def test_an_option_whose_package_is_missing_is_refused_in_one_line(installed):
    """tokenizer=bpe without tokenizers (blocked as Python blocks a module): one line naming the extra, exit 2."""
    code = (
        "import sys; sys.modules['tokenizers'] = None\n"
        "from harness.main import main\n"
        "sys.argv = ['posbench', '--check', 'tokenizer=bpe', 'task=clm']\n"
        "sys.exit(main())"
    )
    done = installed.run(installed.python, "-c", code)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        "error: tokenizer=bpe needs tokenizers, which is not installed here; "
        "pip install 'posbench[hf]' (in a checkout: pip install -e '.[hf]')\n"
    )


def test_a_hub_tokenizer_without_network_is_refused_at_once(installed, tmp_path):
    """The README's GPU recipe (tokenizer=hf tokenizer.name=gpt2) where the Hub cannot be reached (here: a refused
    port as its endpoint, an empty cache): one line (one connection attempt, tests/unit/test_tokenizers.py counts
    it), not a wait on the libraries' retries."""
    done = installed.run(
        installed.posbench,
        "--check",
        "task=clm",
        "tokenizer=hf",
        "tokenizer.name=gpt2",
        HF_ENDPOINT="http://127.0.0.1:9",
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_OFFLINE="0",
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the Hub was not asked (http://127.0.0.1:9 cannot be reached" in done.stderr


def test_prepare_writes_shards_that_the_installed_copy_trains_on(installed, replies):
    """README: posbench prepare DIR ...; then data=tokens data.path=DIR (byte ids of a local file: the corpus.txt
    the replies fixture writes)."""
    done = replies[f"posbench {' '.join(PREPARED)}"]
    assert done["code"] == 0, done["stdout"] + done["stderr"]
    assert (installed.cwd / "shards" / "manifest.json").is_file()
    done = replies[f"posbench {' '.join(TRAINED_ON_THE_SHARDS)}"]
    assert done["code"] == 0 and "data=tokens" in done["stdout"], done["stdout"] + done["stderr"]


def readme_use_lines() -> list[str]:
    """The lines of the README's "Use" block: each a command, a comment after `` #``."""
    block = (ROOT / "README.md").read_text().split("\n## Use\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


SMOLLM_135M = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
}


@pytest.fixture(scope="module")
def readme_files(installed) -> dict[str, str]:
    """What the README's lines point at (``~/books/``, ``~/corpus/``), made small in the working directory."""
    import datasets

    books, corpus = installed.cwd / "books", installed.cwd / "corpus"
    books.mkdir()
    rows = [f"Line {i} of a small book, with the {('quick', 'slow')[i % 2]} fox and {i % 9} dogs." for i in range(3000)]
    (books / "a.txt").write_text("\n".join(rows) + "\n")
    corpus.mkdir()
    datasets.Dataset.from_dict({"text": rows}).to_parquet(str(corpus / "part.parquet"))
    model = installed.cwd / "SmolLM-135M"  # hf-eval's line is checked (--check): what --check reads of a folder
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM_135M))  # its config.json: --check budgets from it
    from tests.helpers import headers_only

    headers_only(model, SMOLLM_135M)  # the weights' header (a sparse file) and a tokenizer.json
    return {
        "~/books/": str(books),
        "~/corpus/": str(corpus),
        " DIR ": " readme-shards ",
        "~/models/SmolLM-135M": str(model),
    }


def readme_argv(line: str, files: dict[str, str]) -> tuple[str, list[str]]:
    """The entry (posbench, or a module of ``python -m``) and argv a README line runs as: a training line with
    --check, hf-eval's with its own --check (nothing loaded), prepare as it is (it writes the shards)."""
    import shlex

    command = line.partition(" #")[0]
    for shown, real in files.items():
        command = command.replace(shown, real)
    words = shlex.split(command)
    args = words[2:] if words[0] == "python" else words[1:]
    if words[:2] == ["python", "-m"]:
        return words[2], words[3:]
    if words[0] == "posbench" and args[:1] == ["hf-eval"]:
        return "posbench", [*args, "--check"]
    if words[0] == "posbench" and args[:1] in (["prepare"], ["check"], ["list"], ["matrix"]):
        return "posbench", args
    if words[0] == "posbench" and args[:1] == ["run"]:
        return "posbench", ["check", *args[1:]]
    own = {a.split("=")[0] for a in args} & {"--list", "--matrix", "--check"}
    return "posbench", [*([] if own else ["--check"]), *args]


DRIVER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("inprocess", sys.argv[1])  # by path: the checkout is not on sys.path
inprocess = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inprocess)
import harness
requests = json.loads(open(sys.argv[2]).read())
replies = [inprocess.run(entry, argv, cwd, env, float(sys.argv[4])) for entry, argv, cwd, env in requests]
open(sys.argv[3], "w").write(json.dumps({"harness": harness.__file__, "replies": replies}))
"""


@pytest.fixture(scope="module")
def replies(installed, readme_files, tmp_path_factory) -> dict[str, dict]:
    """OWN_COMMANDS (keyed ``entry argv…`` as written there), the trained fixture's sweep first, then every line of
    the README's "Use" block (keyed by the line), run by the installed copy in one interpreter of its environment,
    the user's package on PYTHONPATH (tests/inprocess.py: the entry functions the commands call, each with its
    own streams and exit status; a fresh interpreter per command would pay the imports once per command)."""
    work = tmp_path_factory.mktemp("replies")
    (installed.cwd / "corpus.txt").write_text("A line of text for the shards, with some words in it.\n" * 2000)
    home = {"conf": installed.cwd / "myconf", "home": installed.cwd}
    own = [(entry, [a.format(**home) for a in argv]) for entry, argv in OWN_COMMANDS]
    readme = [readme_argv(line, readme_files) for line in readme_use_lines()]
    env = {"POSBENCH_CACHE": str(work / "cache")}
    (work / "requests.json").write_text(json.dumps([[*r, str(installed.cwd), env] for r in [*own, *readme]]))
    done = installed.run(
        installed.python,
        "-c",
        DRIVER,
        ROOT / "tests" / "inprocess.py",
        work / "requests.json",
        work / "replies.json",
        HANG,
        **installed.user,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    replies = json.loads((work / "replies.json").read_text())
    assert Path(replies["harness"]).is_relative_to(installed.site), replies["harness"]  # the installed copy ran
    keys = [f"{entry} {' '.join(argv)}" for entry, argv in OWN_COMMANDS] + readme_use_lines()
    assert len(set(keys)) == len(keys), keys  # one reply per command
    return dict(zip(keys, replies["replies"], strict=True))


@pytest.mark.parametrize("line", readme_use_lines(), ids=lambda line: line.partition(" #")[0].strip())
def test_every_line_of_the_readmes_use_block_passes_check_from_the_installed_copy(replies, line):
    """Each command of the README's "Use" block, as a user types it against an installed copy: validated with
    --check (a training line) or run as it is (--list, --matrix, --check, prepare), from another directory. A line
    the README shows refused ("the one line a bad config gets") must give exactly that: one line, exit 2."""
    done = replies[line]
    if "bad config" in line.partition(" #")[2]:
        assert done["code"] == 2 and done["stderr"].startswith("error: ") and done["stderr"].count("\n") == 1, line
        return
    assert done["code"] == 0, f"{line}\n{done['stdout'][-2000:]}{done['stderr'][-2000:]}"
    entry, argv = readme_argv(line, {})
    if ("--check" in argv or argv[:1] == ["check"]) and entry == "posbench":
        assert done["stdout"].startswith("ok: "), done["stdout"]
