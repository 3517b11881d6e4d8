# Every target sets up its own virtual environment when missing.
# Real users: override the torch wheel, e.g. `make setup TORCH_SPEC="torch"` for a CUDA build.
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.focusattn-installed
RUNS        ?= runs

.PHONY: setup demo test test-all bench bench-kernels bench-lazy experiments lab results clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# The main job on the offline defaults: retrofit Focus onto SmolLM2-135M with Shakespeare (~15 min on 2 cores).
demo: $(STAMP)
	$(VENV)/bin/focusattn retrofit --model smollm2-135m --data shakespeare --out $(RUNS)/demo

test: $(STAMP)
	$(PY) -m pytest

# Everything, including slow experiments-as-tests.
test-all: $(STAMP)
	$(PY) -m pytest -m ""

bench: $(STAMP)
	$(VENV)/bin/focusattn bench --out $(RUNS)/bench

results: $(STAMP)
	$(VENV)/bin/focusattn report --runs $(RUNS) --out docs/RESULTS.md

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis src/*.egg-info
