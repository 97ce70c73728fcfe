"""Compose the project's Hydra config outside ``run.py`` (benchmarks, reports, tests)."""

from __future__ import annotations

from harness.paths import CONF


def preset_scales(preset: str) -> list[str]:
    """The scales a preset has sizes for (conf/experiment/<preset>/scale/<scale>.yaml)."""
    return sorted(p.stem for p in (CONF / "experiment" / preset / "scale").glob("*.yaml"))


def compose(overrides: list[str] = (), hydra: bool = False):
    """The config ``python run.py <overrides>`` would see (with ``hydra`` to keep its hydra node)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)
