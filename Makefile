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
	$(PY) -m pip install -q -e ".[dev,eval]"
	@# headless Chromium for the HTML report test (skipped without it); never fails where apt is unavailable
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
	  echo "note: chromium not installed; the HTML rendering test will be skipped"
	touch $(STAMP)

# The main job on the offline defaults: retrofit Focus onto SmolLM2-135M with Shakespeare (~15 min on 2 cores).
demo: $(STAMP)
	$(VENV)/bin/focusattn retrofit --model smollm2-135m --data shakespeare --out $(RUNS)/demo

test: $(STAMP)
	$(PY) -m pytest

# Everything, including slow experiments-as-tests.
test-all: $(STAMP)
	$(PY) -m pytest -m ""

# Kernel speed (~11 min on 2 cores; add --lengths ... 65536 where time allows) and the Lazy kernel (~2 min).
bench: $(STAMP)
	$(VENV)/bin/focusattn bench --out $(RUNS)/bench --lengths 1024 4096 16384 32768 --repeats 2 --flex-groups 8 --threads 1
	$(VENV)/bin/focusattn bench-lazy --out $(RUNS)/bench-lazy --threads 1

# The retrofit's open decisions, measured on one budget (the demo's), then RESULTS.md. ~15 min per run here.
EXP_RUNS := default paper_mask mult_paper mult_offset sequence
experiments: $(STAMP)
	$(VENV)/bin/focusattn retrofit --out $(RUNS)/exp/default
	$(VENV)/bin/focusattn retrofit --out $(RUNS)/exp/paper_mask --sink-tokens 0
	$(VENV)/bin/focusattn retrofit --out $(RUNS)/exp/mult_paper --gate multiplicative --gate-offset 0
	$(VENV)/bin/focusattn retrofit --out $(RUNS)/exp/mult_offset --gate multiplicative --gate-offset 0.5
	$(VENV)/bin/focusattn retrofit --out $(RUNS)/exp/sequence --routing sequence
	mkdir -p docs/results
	for r in $(EXP_RUNS); do cp $(RUNS)/exp/$$r/summary.json docs/results/retrofit_$$r.json; done
	$(MAKE) results

# From-scratch lab: six attentions x 3 seeds at equal compute (~3 min a run here), then the longer preset in which
# the standard model grows an attention sink (~6 min a run).
lab: $(STAMP)
	$(VENV)/bin/focusattn compare --attention standard,lazy,focus,elastic-only,lazy-no-bias,sliding --seeds 3 --preset lab --out $(RUNS)/lab
	$(VENV)/bin/focusattn compare --attention standard,lazy --seeds 3 --preset lab-long --out $(RUNS)/lab-long

results: $(STAMP)
	$(VENV)/bin/focusattn report --results docs/results --out docs/RESULTS.md

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis src/*.egg-info
