# The two set-up commands of the README:  `make run`  and  `make test`.
PY ?= python3
# A local CPU build of torch 2.13.0 is taken when present; override for a CUDA machine,
# e.g. `make run TORCH=torch==2.13.0+cu128` or TORCH= to keep the torch you have.
TORCH ?= torch==2.13.0

.PHONY: install run test lint

install:
	$(if $(TORCH),$(PY) -m pip install -q $(TORCH))
	$(PY) -m pip install -q -e ".[test]"

run: install  ## default ablation: none vs learned vs RoPE × 3 seeds, masked LM on the embedded corpus (conf/experiment/ablation.yaml)
	$(PY) run.py -m experiment=ablation

test: install
	tools/ensure-chromium  # the dashboard test drives headless chromium (installed only where missing)
	$(PY) -m pytest -q

lint:  ## ruff (rules E, F, I, B, UP; 120 columns; configured in pyproject.toml), installed by `make install`
	$(PY) -m ruff check .
