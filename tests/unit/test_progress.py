"""Progress output: a bar in a terminal, a few plain lines in a redirected log, nothing when disabled."""

from __future__ import annotations

import io
import logging

import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from harness.config.check import check
from harness.config.load import load
from harness.config.spec import ProgressSettings
from harness.errors import ConfigError
from harness.model import progress
from harness.model.progress import LIGHTNING_INFO_LOGGERS, ProgressLines, clock, progress_callbacks
from tests.helpers import TINY


def validate(overrides: list[str]):
    return check(load(overrides)).spec


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def lightning_levels():
    """Restore the Lightning loggers' levels that a non-terminal pick lowers."""
    saved = {name: logging.getLogger(name).level for name in LIGHTNING_INFO_LOGGERS}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def kinds(callbacks) -> list[type]:
    return [type(c) for c in callbacks]


def test_auto_picks_the_rich_bar_in_a_terminal_and_lines_elsewhere(lightning_levels):
    assert kinds(progress_callbacks("auto", 10, stream=Terminal())) == [RichProgressBar]
    assert kinds(progress_callbacks("auto", 10, stream=io.StringIO())) == [ProgressLines]


def test_explicit_modes_and_the_tqdm_fallback(lightning_levels, monkeypatch):
    assert kinds(progress_callbacks("lines", 10, stream=Terminal())) == [ProgressLines]
    assert kinds(progress_callbacks("bar", 10, stream=io.StringIO())) == [RichProgressBar]
    monkeypatch.setattr(progress, "rich_available", lambda: False)
    assert kinds(progress_callbacks("bar", 10, stream=Terminal())) == [TQDMProgressBar]


def test_enable_progress_bar_false_still_means_nothing(lightning_levels):
    assert progress_callbacks("auto", 10, enabled=False, stream=Terminal()) == []
    assert progress_callbacks("auto", 10, enabled=False, stream=io.StringIO()) == []


def test_lightning_info_is_quiet_only_off_a_terminal(lightning_levels):
    for name in LIGHTNING_INFO_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    progress_callbacks("auto", 10, stream=Terminal())
    assert all(logging.getLogger(n).getEffectiveLevel() == logging.INFO for n in LIGHTNING_INFO_LOGGERS)
    progress_callbacks("auto", 10, stream=io.StringIO())
    assert all(logging.getLogger(n).getEffectiveLevel() == logging.WARNING for n in LIGHTNING_INFO_LOGGERS)


def test_progress_settings_are_checked(store):
    assert validate([*TINY, "progress.mode=lines", "trainer.enable_progress_bar=true"]).progress == ProgressSettings(
        "lines", 50
    )
    assert validate(TINY).progress.mode == "auto"  # auto with no bar: the tests' setting, allowed
    with pytest.raises(ConfigError, match="progress.mode=bar asks for progress but trainer.enable_progress_bar=false"):
        validate([*TINY, "progress.mode=bar"])
    with pytest.raises(ConfigError, match="progress.every_n_steps=0 must be a positive integer"):
        validate([*TINY, "progress.every_n_steps=0"])
    with pytest.raises(ConfigError, match="progress.mode='tqdm': use auto, bar or lines"):
        validate([*TINY, "progress.mode=tqdm"])


def test_clock():
    assert [clock(s) for s in (0, 59.6, 61, 3600 * 2 + 65)] == ["0:00:00", "0:01:00", "0:01:01", "2:01:05"]


def test_lightnings_leafspec_warning_is_hidden_and_nothing_else():
    """torch's LeafSpec FutureWarning raised from Lightning's _pytree goes; the same warning from elsewhere stays."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        progress.quiet_lightning_pytree()
        text = "`isinstance(treespec, LeafSpec)` is deprecated, use ..."
        warnings.warn_explicit(text, FutureWarning, "_pytree.py", 21, module="lightning.pytorch.utilities._pytree")
        warnings.warn_explicit(text, FutureWarning, "mine.py", 1, module="mine")
        warnings.warn_explicit("other", FutureWarning, "_pytree.py", 21, module="lightning.pytorch.utilities._pytree")
    assert [str(w.message)[:5] for w in caught] == ["`isin", "other"]
