# The two set-up commands of the README:  `make run`  and  `make test`.
# An active virtual environment (or conda env) is used as it is; with none active, one is made in .venv here, so a
# system whose only Python is the distribution's (PEP 668: pip refuses to install into it) needs no set-up step.
ifeq ($(VIRTUAL_ENV)$(CONDA_PREFIX),)
PY ?= .venv/bin/python
else
PY ?= python3
endif
# A local CPU build of torch 2.13.0 is taken when present; override for a CUDA machine,
# e.g. `make run TORCH=torch==2.13.0+cu128` or TORCH= to keep the torch you have.
TORCH ?= torch==2.13.0

.PHONY: install run test test-fast lint

.venv/bin/python:
	python3 -m venv .venv

install: $(if $(filter .venv/bin/python,$(PY)),.venv/bin/python)
	$(if $(TORCH),$(PY) -m pip install -q $(TORCH))
	$(PY) -m pip install -q -e ".[test]"

run: install  ## default ablation: none vs learned vs RoPE × 3 seeds, masked LM on the embedded corpus (conf/experiment/ablation.yaml)
	$(PY) run.py -m experiment=ablation

# Test files are spread over this many worker processes (pytest-xdist), each file's tests on one worker, so
# module fixtures are built once: the suite keeps a core busy per worker (alone, it used one of two cores). Files go
# to the workers in collection order (--no-loadscope-reorder), so tests/process's long real-command files start first;
# xdist's default order, most tests first, left the slow install test and its peers for last (one worker alone at
# the end).
WORKERS ?= 2

test: install
	tools/ensure-chromium  # the dashboard test drives headless chromium (installed only where missing)
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder

test-fast:  ## tests/unit only, for your own loop (no training end to end, no real command, no install step)
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder tests/unit

lint: install  ## ruff's formatter and linter (rules E, F, I, B, UP; 120 columns) and mypy (the files in [tool.mypy]), configured in pyproject.toml; `ruff format .` fixes the first
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy
