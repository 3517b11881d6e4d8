# Every target sets up its own virtual environment when missing.
# Real users: override the torch wheel, e.g. `make setup TORCH_SPEC="torch"` for a CUDA build.
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.focusattn-installed
RUNS        ?= runs

.PHONY: bench-ship key-groups registers ship-means ship-union ship-floor floor-baselines bench-keyed floor-union32 ship-floor32 floor32-h19 floor32-heads ship-floor32-copy bench-floor32-copy setup demo test test-dist gpu-dry-run test-all bench bench-64k bench-dispatch bench-kernels bench-lazy experiments lab lab-sink lazy results clean \
	e2e e2e-measure \
	e2e-k16 lora ablation sweeps sweeps-run routing dense-heads copy-heads ship-g2 routing-long routing-qproj routing-mlp routing-imitation imitation-curve routing-window routing-keys routing-keyspace ship-keys keys-nodense bench-short python-docs

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,gguf,plot,eval,lora]"
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

# The GPU check without a GPU: the CPU tests of the GPU path and scripts/gpu_bench.py at tiny lengths on the CPU
# (the script is checked, nothing is measured); CI runs it after `make test`.
gpu-dry-run: $(STAMP)
	PYTHON=$(PY) bash scripts/gpu_check.sh --dry-run $(RUNS)/gpu_dry_run

# Multi-process runs (torchrun and accelerate launch): 2 CPU processes over gloo (DDP, FSDP2 for retrofit and lab,
# SIGKILL + resume); CI runs it after `make test`.
test-dist: $(STAMP)
	$(PY) -m pytest -m dist

# Everything, including slow experiments-as-tests.
test-all: $(STAMP)
	$(PY) -m pytest -m ""

# Kernel speed at random balanced routing (~13 min on 1 core), at the routing the shipped adapter learned and at
# Zipf-imbalanced routing (~3 min each), the Lazy kernel (~2 min); then RESULTS. Add --lengths ... 65536 where time allows.
ROUTING_FILE := docs/results/data/routing-smollm2-135m-focus-k8.safetensors
bench: $(STAMP)
	$(VENV)/bin/focusattn bench --out $(RUNS)/bench --lengths 1024 4096 16384 32768 --repeats 2 --flex-groups 8 --threads 1
	$(VENV)/bin/focusattn bench --out $(RUNS)/bench-captured --routing captured --routing-file $(ROUTING_FILE) \
		--groups 8 --top-k 1 2 --lengths 1024 2048 4096 --repeats 3 --no-flex --decode-len 0 --threads 1 \
		--memory-backward
	$(VENV)/bin/focusattn bench --out $(RUNS)/bench-zipf --routing zipf --groups 8 16 --top-k 1 2 \
		--lengths 4096 16384 --repeats 2 --no-flex --decode-len 0 --threads 1
	for dt in bfloat16 float16; do $(VENV)/bin/focusattn bench --out $(RUNS)/bench-$$dt --dtype $$dt --groups 8 \
		--top-k 1 2 --lengths 4096 16384 --repeats 2 --no-flex --decode-len 0 --threads 1 || exit 1; done
	$(VENV)/bin/focusattn bench-lazy --out $(RUNS)/bench-lazy --threads 1
	$(VENV)/bin/focusattn bench-dispatch --out $(RUNS)/dispatch --routing-file $(ROUTING_FILE) --threads 1 --install
	mkdir -p docs/results
	cp $(RUNS)/dispatch/dispatch_bench.json docs/results/
	cp $(RUNS)/bench/bench.json $(RUNS)/bench/bench.png docs/results/
	for r in captured zipf bfloat16 float16; do cp $(RUNS)/bench-$$r/bench.json docs/results/bench_$$r.json; \
		cp $(RUNS)/bench-$$r/bench.png docs/results/bench_$$r.png; done
	cp $(RUNS)/bench-lazy/lazy_bench.json $(RUNS)/bench-lazy/lazy_bench.png docs/results/
	$(MAKE) results

# The break-evens backend="auto" reads (~6 min on 1 core; part of `make bench` too): masked vs decomposed prefill and
# masked vs gathered decode at the shipped adapter's routing, written into the packaged kernels/dispatch.json.
bench-dispatch: $(STAMP)
	$(VENV)/bin/focusattn bench-dispatch --out $(RUNS)/dispatch --routing-file $(ROUTING_FILE) --threads 1 --install
	mkdir -p docs/results
	cp $(RUNS)/dispatch/dispatch_bench.json docs/results/
	$(MAKE) results

# Issue 23's whole model at short and medium contexts, alternating with the original in one process: the k8 adapter
# at top-1 and top-2 (~25 min on 1 core), then the shipped g2 at top-1 with its cap, global keys and dense heads
# (~12 min). Run on a quiet machine.
SHORT_G2 := --lengths 512 1024 2048 --decode-lengths 4096 8192 --top-k 1 --repeats 3 --decode-tokens 16 --threads 1
bench-short: $(STAMP)
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-k8 --lengths 64 128 256 512 1024 2048 \
		--decode-lengths 4096 8192 --top-k 1 2 --repeats 5 --decode-tokens 16 --threads 1 --out $(RUNS)/bench-short8
	cp $(RUNS)/bench-short8/model_bench.json docs/results/short_model_bench.json
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-g2 $(SHORT_G2) --out $(RUNS)/bench-short-g2
	cp $(RUNS)/bench-short-g2/model_bench.json docs/results/short_model_bench_g2.json
	$(MAKE) results

# The 64K point (K=8 top-1, prefill and decode; ~6 min on 1 core), separate for time.
bench-64k: $(STAMP)
	$(VENV)/bin/focusattn bench --out $(RUNS)/bench64k --lengths 65536 --groups 8 --top-k 1 --repeats 2 --no-flex \
		--threads 1 --decode-len 65536 --decode-repeats 5
	cp $(RUNS)/bench64k/bench.json docs/results/bench_64k.json
	cp $(RUNS)/bench64k/bench.png docs/results/bench_64k.png
	$(MAKE) results

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

# Lazy Attention where sinks form (T = 512): standard, Elastic-Softmax alone and Lazy, 3 seeds (~15-25 min a run on
# 1 core; finished runs are reused), then evaluation-time probes (the threshold cap at 2x/4x, empty rows, zero tiles).
lab-sink: $(STAMP)
	$(VENV)/bin/focusattn compare --attention standard,lazy,elastic-only --seeds 3 --preset lab-sink --threads 1 \
		--out $(RUNS)/lab-sink --no-progress
	mkdir -p docs/results
	cp $(RUNS)/lab-sink/compare.json docs/results/lab.sink.json
	PYTHONPATH=src $(VENV)/bin/python scripts/lab_probes.py --preset lab-sink --variants standard,elastic-only,lazy \
		--seeds 3 --out $(RUNS)/lab-sink --json docs/results/lab.sink_probes.json
	$(MAKE) results

# Elastic-Softmax on the pretrained model: the tau trade-off (training-free), tau trained on the frozen model, tau with
# LoRA on q,k, tau with the distance-bias table; the trained adapters' statistics, long-context probes and lm-eval.
# ~1.5 h on 1 core.
lazy: $(STAMP)
	mkdir -p docs/results
	$(VENV)/bin/focusattn lazy-probe --taus 0.03,0.1,0.3,1,3 --lengths 512,2048 --threads 1 --out $(RUNS)/lazy-probe \
		--no-progress
	cp $(RUNS)/lazy-probe/lazy_probe.json docs/results/lazy_probe.json
	$(VENV)/bin/focusattn retrofit --method lazy --tau-init 1 --lr 0.05 --steps 60 --threads 1 --out $(RUNS)/lazy-tau
	$(VENV)/bin/focusattn retrofit --method lazy+lora --lora-rank 8 --tau-init 1 --lr 0.005 --steps 60 --threads 1 \
		--out $(RUNS)/lazy-lora
	cp $(RUNS)/lazy-tau/summary.json docs/results/lazy_retrofit_tau.json
	cp $(RUNS)/lazy-lora/summary.json docs/results/lazy_retrofit_lora.json
	$(VENV)/bin/focusattn lazy-probe --taus "" --adapters $(RUNS)/lazy-tau,$(RUNS)/lazy-lora --lengths 512,2048 \
		--threads 1 --out $(RUNS)/lazy-probe-trained --no-progress
	cp $(RUNS)/lazy-probe-trained/lazy_probe.json docs/results/lazy_probe_trained.json
	$(VENV)/bin/focusattn retrofit --method lazy --lazy-bias --tau-init 1 --lr 0.05 --steps 60 --threads 1 \
		--out $(RUNS)/lazy-bias
	cp $(RUNS)/lazy-bias/summary.json docs/results/lazy_retrofit_bias.json
	$(VENV)/bin/focusattn lazy-probe --taus "" --adapters $(RUNS)/lazy-tau,$(RUNS)/lazy-bias --lengths 512,2048 \
		--threads 1 --out $(RUNS)/lazy-probe-bias --no-progress
	cp $(RUNS)/lazy-probe-bias/lazy_probe.json docs/results/lazy_probe_trained_bias.json
	for r in tau lora; do \
		$(VENV)/bin/focusattn long-eval --adapter $(RUNS)/lazy-$$r --lengths 2048 --threads 1 \
			--out $(RUNS)/le-lazy-$$r || exit 1; \
		cp $(RUNS)/le-lazy-$$r/long_eval.json docs/results/long_eval_lazy_$$r.json; \
	done
	$(VENV)/bin/focusattn eval --adapter $(RUNS)/lazy-lora --tasks offline --limit 10 --threads 1 --out $(RUNS)/ev-lazy
	cp $(RUNS)/ev-lazy/eval.json docs/results/eval_lazy.json
	$(MAKE) results

# Focus vs LoRA (the paper's Tables 3-4): LoRA r=4 and r=16 on the attention projections (q,k,v,o) with the demo's
# data, steps, seed, schedule and evaluation, compared with retrofit_default.json (`make experiments`). ~15 min a run.
lora: $(STAMP)
	$(VENV)/bin/focusattn retrofit --method lora --lora-rank 4 --out $(RUNS)/lora/r4
	$(VENV)/bin/focusattn retrofit --method lora --lora-rank 16 --out $(RUNS)/lora/r16
	mkdir -p docs/results
	cp $(RUNS)/lora/r4/summary.json docs/results/lora_r4.json
	cp $(RUNS)/lora/r16/summary.json docs/results/lora_r16.json
	$(MAKE) results

# The collapse ablation (the paper's §5, Table 8): softmax normalisation vs Sinkhorn with sequence routing vs Sinkhorn
# with causal routing, largest-group share per layer at every step. ~10 min a run at the default budget; raise
# ABL_FLAGS' --steps for a longer look (the paper saw softmax collapse within 600 steps).
ABL       ?= $(RUNS)/ablation
ABL_FLAGS ?= --steps 60 --seq-len 512 --eval-top-k 1,2
ablation: $(STAMP)
	$(VENV)/bin/focusattn retrofit $(ABL_FLAGS) --sinkhorn-iters 0 --out $(ABL)/softmax
	$(VENV)/bin/focusattn retrofit $(ABL_FLAGS) --routing sequence --out $(ABL)/sinkhorn-sequence
	$(VENV)/bin/focusattn retrofit $(ABL_FLAGS) --routing causal --out $(ABL)/sinkhorn-causal
	mkdir -p docs/results
	$(VENV)/bin/focusattn collapse softmax=$(ABL)/softmax sinkhorn-sequence=$(ABL)/sinkhorn-sequence \
		sinkhorn-causal=$(ABL)/sinkhorn-causal --out docs/results/collapse.json
	$(MAKE) results

# Sweeps (the paper's Table 9 analogue) in the background: one factor at a time around the default (K=8, w=128,
# tau=0.1, d_g=16) at the demo budget, 9 runs of ~15 min; finished points are skipped when started again.
SWEEP       ?= $(RUNS)/sweeps
SWEEP_FLAGS ?= --eval-top-k 1,2
sweeps: $(STAMP)
	mkdir -p $(SWEEP)
	nohup $(MAKE) sweeps-run > $(SWEEP)/sweeps.log 2>&1 &
	@echo "sweeps run in the background: tail -f $(SWEEP)/sweeps.log (RESULTS.md is regenerated at the end)"

sweeps-run: $(STAMP)
	mkdir -p docs/results
	printf '%s\n' "default" "K4 --groups 4" "K16 --groups 16" "w64 --window 64" "w256 --window 256" \
		"tau0.05 --tau 0.05" "tau0.5 --tau 0.5" "dg8 --group-dim 8" "dg32 --group-dim 32" | \
	while read name flags; do \
		test -f $(SWEEP)/$$name/summary.json || \
			$(VENV)/bin/focusattn retrofit $(SWEEP_FLAGS) $$flags --out $(SWEEP)/$$name || exit 1; \
		cp $(SWEEP)/$$name/summary.json docs/results/sweep_$$name.json; \
	done
	$(MAKE) results

results: $(STAMP)
	$(VENV)/bin/focusattn report --results docs/results --out docs/RESULTS.md

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis src/*.egg-info

# End to end (issue: the same trained adapter at long context): train at 1024 tokens with the balance loss and the
# lambda schedule, continue at 2048 tokens distilled from the original model (a quarter of the windows with a
# repeated second half, online rebalancing as served), then whole-model speed and long-context quality against the
# baselines, then ship the adapter with its model card and regenerate RESULTS. ~3.5 h on 2 cores.
E2E := $(RUNS)/e2e
e2e: $(STAMP)
	$(VENV)/bin/focusattn retrofit --seq-len 1024 --steps 40 --warmup 4 --grad-checkpointing --groups 8 \
		--balance-loss 1.0 --lam-final 40 --eval-windows 4 --ood-eval-windows 4 --eval-top-k 1,2 \
		--checkpoint-every 10 --out $(E2E)/k8
	$(VENV)/bin/focusattn retrofit --seq-len 2048 --steps 60 --warmup 5 --lr 3e-3 --grad-checkpointing --groups 8 \
		--balance-loss 1.0 --distill 1.0 --repeat-prob 0.25 --init-adapter $(E2E)/k8 --rebalance 256 --lam 40 \
		--eval-windows 4 --ood-eval-windows 4 --eval-top-k 1,2 --checkpoint-every 10 --out $(E2E)/k8d
	$(MAKE) e2e-measure

e2e-measure: $(STAMP)
	@# the first run's adapter as trained (learned offsets only)
	$(VENV)/bin/focusattn long-eval --adapter $(E2E)/k8/adapter --lengths 2048 --ppl-windows 4 \
		--threads 2 --out $(E2E)/long
	$(VENV)/bin/focusattn long-eval --adapter $(E2E)/k8/adapter --lengths 4096 8192 --repeat-n 1 --threads 2 \
		--variants original,top1,top2,sliding@top1 --out $(E2E)/long8k
	@# as shipped (the continued run, online rebalancing every 256 tokens), measured under its shipped name
	$(VENV)/bin/focusattn ship-adapter $(E2E)/k8d --name smollm2-135m-focus-k8 --rebalance 256 --first-phase $(E2E)/k8
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-k8 --lengths 2048 --ppl-windows 4 \
		--passkey-per-depth 2 --baselines untrained \
		--variants original,soft,top1,top2,untrained@top1,untrained@top2 --threads 1 --out $(E2E)/long_rb
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-k8 --lengths 4096 8192 --ppl-max-len 2048 \
		--repeat-n 1 --baselines '' --no-soft --variants top1,top2 --threads 1 --out $(E2E)/long_rb8k
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-k8 --lengths 8192 --top-k 1 2 \
		--repeats 1 --decode-tokens 16 --threads 1 --out $(E2E)/bench
	$(VENV)/bin/focusattn ship-adapter $(E2E)/k8d --name smollm2-135m-focus-k8 --rebalance 256 --first-phase $(E2E)/k8 \
		--long-eval $(E2E)/long_rb/long_eval.json --model-bench $(E2E)/bench/model_bench.json
	cp $(E2E)/k8/summary.json docs/results/retrofit_long_e2e_k8.json
	cp $(E2E)/k8d/summary.json docs/results/retrofit_long_e2e_k8d.json
	cp $(E2E)/bench/model_bench.json docs/results/model_bench_k8.json
	cp $(E2E)/bench/model_bench.png docs/results/model_bench_k8.png
	cp $(E2E)/long/long_eval.json docs/results/long_eval_k8.json
	cp $(E2E)/long8k/long_eval.json docs/results/long_eval_k8_8k.json
	cp $(E2E)/long_rb/long_eval.json docs/results/long_eval_k8_rebalance.json
	cp $(E2E)/long_rb8k/long_eval.json docs/results/long_eval_k8_rebalance_8k.json
	$(MAKE) results

# The K=16 point of the Pareto table: same recipe, served with the same rebalancing (~1 h of training here).
e2e-k16: $(STAMP)
	$(VENV)/bin/focusattn retrofit --seq-len 1024 --steps 40 --warmup 4 --grad-checkpointing --groups 16 \
		--balance-loss 1.0 --lam-final 40 --eval-windows 4 --ood-eval-windows 4 --eval-top-k 1,2 \
		--checkpoint-every 10 --out $(E2E)/k16
	$(VENV)/bin/focusattn long-eval --adapter $(E2E)/k16/adapter --rebalance 256 --lengths 2048 --ppl-windows 4 \
		--baselines "" --no-soft --variants original,top1,top2 --threads 1 --out $(E2E)/long_k16
	$(VENV)/bin/focusattn bench-model --adapter $(E2E)/k16/adapter --rebalance 256 --lengths 8192 --top-k 1 2 \
		--repeats 1 --threads 2 --out $(E2E)/bench_k16
	cp $(E2E)/k16/summary.json docs/results/retrofit_long_e2e_k16.json
	cp $(E2E)/long_k16/long_eval.json docs/results/long_eval_k16_rebalance.json
	cp $(E2E)/bench_k16/model_bench.json docs/results/model_bench_k16.json
	cp $(E2E)/bench_k16/model_bench.png docs/results/model_bench_k16.png
	$(MAKE) results

# Debian's Python documentation: the offline corpus `python-docs` (a third register; never needed by make test).
python-docs:
	test -n "$$(ls -d /usr/share/doc/python3*/html/_sources 2>/dev/null)" || \
	  { apt-get update -qq && apt-get install -y -qq python3-doc >/dev/null; }

# Routing that keeps what the model attends to (attention recall): routers trained against the frozen model's own
# attention (--objective attention, no backward through the model) with global keys, on two registers; long-eval
# with recall, k-means and oracle rows for it and for the shipped adapter; whole-model speed at 8192; the global-key
# probe. ~2.5 h on 2 cores (the targets of 24 windows are the slow part; they are kept in $(ROUTE)/targets).
ROUTE ?= $(RUNS)/routing
LE_FLAGS := --lengths 2048 --ppl-windows 2 --recall-windows 2 --passkey-per-depth 1 --repeat-n 1 --no-soft --threads 1
# every top-1 baseline at its budget (long-eval), the 8192 probes beside sliding + duo, the 2048/8192 whole-model bench
LE_TOP1 := --variants original,top1,sliding@top1,duo@top1,random@top1,untrained@top1,kmeans@top1,oracle@top1
LE_8K := --lengths 8192 --passkey-per-depth 1 --repeat-n 1 --no-soft --baselines sliding,duo \
	--variants original,top1,sliding@top1,duo@top1 --threads 1
BM_TOP1 := --lengths 2048 8192 --top-k 1 --repeats 1 --decode-tokens 8 --threads 1
# the served lengths beyond 2048: perplexity (one window per split), the probes and recall at 4096 and 8192
LE_LONG := --lengths 4096 8192 --ppl-max-len 8192 --ppl-windows 1 --recall-windows 1 --passkey-per-depth 1 \
	--repeat-n 1 --no-soft --top-k 1 --baselines sliding,duo,oracle \
	--variants original,top1,sliding@top1,duo@top1,oracle@top1 --threads 1
# the other training-free masks at 8192 (k-means keys; random groups and an untrained router), two runs that fit
# one core each; their rows join the same adapter's in RESULTS and README (the original's row is LE_LONG's)
LE_8K_BASE := --lengths 8192 --ppl-max-len 8192 --ppl-windows 1 --recall-windows 1 --passkey-per-depth 1 \
	--repeat-n 1 --no-soft --top-k 1 --threads 1
routing: $(STAMP) python-docs
	$(PY) scripts/global_keys_probe.py --out docs/results/global_keys_probe.json
	$(VENV)/bin/focusattn retrofit --objective attention --data shakespeare+python-docs --seq-len 2048 --pool 24 \
		--steps 800 --warmup 20 --lr 5e-3 --balance-loss 0.1 --attn-keys 64 --global-rate 0.02 --eval-windows 2 \
		--ood-eval-windows 2 --eval-top-k 1,2 --checkpoint-every 200 --rebalance 256 --threads 1 \
		--targets-cache $(ROUTE)/targets --out $(ROUTE)/g2
	$(VENV)/bin/focusattn long-eval --adapter $(ROUTE)/g2/adapter $(LE_FLAGS) \
		--variants original,top1,top2,sliding@top1,kmeans@top1,oracle@top1,untrained@top1 --out $(ROUTE)/le_g2
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-k8 $(LE_FLAGS) --variants original,oracle@top1 \
		--out $(ROUTE)/le_shipped
	$(VENV)/bin/focusattn bench-model --adapter $(ROUTE)/g2/adapter --lengths 8192 --top-k 1 2 --repeats 1 \
		--decode-tokens 8 --threads 1 --out $(ROUTE)/bm_g2
	cp $(ROUTE)/g2/summary.json docs/results/retrofit_long_attention_g2.json
	cp $(ROUTE)/le_g2/long_eval.json docs/results/long_eval_attention_g2.json
	cp $(ROUTE)/le_shipped/long_eval.json docs/results/long_eval_k8_recall.json
	cp $(ROUTE)/bm_g2/model_bench.json docs/results/model_bench_attention_g2.json
	cp $(ROUTE)/bm_g2/model_bench.png docs/results/model_bench_attention_g2.png
	$(VENV)/bin/focusattn long-eval --adapter $(ROUTE)/g2/adapter --rebalance-warm $(LE_FLAGS) \
		--variants original,top1,sliding@top1,random@top1,untrained@top1,kmeans@top1,oracle@top1 --out $(ROUTE)/le_g2w
	cp $(ROUTE)/le_g2w/long_eval.json docs/results/long_eval_attention_g2_warm.json
	$(VENV)/bin/focusattn bench-model --adapter $(ROUTE)/g2/adapter --rebalance-warm --lengths 2048 8192 --top-k 1 2 \
		--repeats 1 --decode-tokens 8 --threads 1 --out $(ROUTE)/bm_g2w
	cp $(ROUTE)/bm_g2w/model_bench.json docs/results/model_bench_attention_g2_warm.json
	cp $(ROUTE)/bm_g2w/model_bench.png docs/results/model_bench_attention_g2_warm.png
	$(VENV)/bin/focusattn retrofit --objective attention --data shakespeare+python-docs --seq-len 2048 --pool 24 \
		--steps 800 --warmup 20 --lr 5e-3 --balance-loss 0.1 --attn-keys 64 --global-rate 0.02 --eval-windows 2 \
		--ood-eval-windows 2 --eval-top-k 1,2 --checkpoint-every 200 --rebalance 256 --rebalance-warm --threads 1 \
		--targets-cache $(ROUTE)/targets --out $(ROUTE)/g2w
	$(VENV)/bin/focusattn long-eval --adapter $(ROUTE)/g2w/adapter $(LE_FLAGS) \
		--variants original,top1,top2,sliding@top1,random@top1,untrained@top1,kmeans@top1,oracle@top1 \
		--out $(ROUTE)/le_g2w_train
	cp $(ROUTE)/g2w/summary.json docs/results/retrofit_long_attention_g2w.json
	cp $(ROUTE)/le_g2w_train/long_eval.json docs/results/long_eval_attention_g2w.json
	$(PY) scripts/warm_rebalance_probe.py --adapters $(ROUTE)/g2/adapter smollm2-135m-focus-k8 \
		--corpora shakespeare lee-news python-code --length 4096 --out docs/results/warm_rebalance_probe.json
	$(MAKE) results

# Dense induction heads (FocusConfig.dense_heads): the 6 KV heads of highest induction score served dense beside
# the routed ones, for the attention-objective adapter (G2, from `make routing`) and the shipped k8 routers; how many
# heads (the sweep), the duo baseline, 2048 and 8192, whole-model speed. ~2.5 h on 2 cores.
G2 ?= $(ROUTE)/g2/adapter
HEADS := --dense-heads induction:6
dense-heads: $(STAMP)
	$(VENV)/bin/focusattn long-eval --adapter $(G2) --rebalance-warm $(HEADS) $(LE_FLAGS) $(LE_TOP1) \
		--out $(ROUTE)/le_g2wd6_2k
	$(VENV)/bin/focusattn long-eval --adapter $(G2) --rebalance-warm $(HEADS) $(LE_8K) \
		--out $(ROUTE)/le_g2wd6_8k
	$(PY) scripts/dense_heads_sweep.py --adapter $(G2) --rebalance-warm --heads 0 2 4 6 8 10 14 \
		--out docs/results/dense_heads_sweep.json
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-k8 $(HEADS) $(LE_FLAGS) $(LE_TOP1) \
		--out $(ROUTE)/le_k8h6_2k
	$(VENV)/bin/focusattn bench-model --adapter $(G2) --rebalance-warm $(HEADS) $(BM_TOP1) --out $(ROUTE)/bm_g2wd6
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-k8 $(HEADS) $(BM_TOP1) --out $(ROUTE)/bm_k8h6
	cp $(ROUTE)/le_g2wd6_2k/long_eval.json docs/results/long_eval_attention_g2_warm_heads6.json
	cp $(ROUTE)/le_g2wd6_8k/long_eval.json docs/results/long_eval_attention_g2_warm_heads6_8k.json
	cp $(ROUTE)/le_k8h6_2k/long_eval.json docs/results/long_eval_k8_heads6.json
	for b in bm_g2wd6:model_bench_attention_g2_warm_heads6 bm_k8h6:model_bench_k8_heads6; do \
		cp $(ROUTE)/$${b%%:*}/model_bench.json docs/results/$${b#*:}.json; \
		cp $(ROUTE)/$${b%%:*}/model_bench.png docs/results/$${b#*:}.png; done
	$(MAKE) results

# Duplicate-token heads beside the induction heads (--dense-heads induction:6+duplicate:4, both scored on repeated
# random tokens): how many (the sweep), 2048 with every baseline + recall (the attention-objective routers and the
# shipped k8 ones), 8192, whole-model speed. ~2 h on 2 cores.
COPY_HEADS := --dense-heads induction:6+duplicate:4
copy-heads: $(STAMP)
	$(VENV)/bin/focusattn long-eval --adapter $(G2) --rebalance-warm $(COPY_HEADS) $(LE_FLAGS) $(LE_TOP1) \
		--out $(ROUTE)/le_g2wcd10_2k
	$(VENV)/bin/focusattn long-eval --adapter $(G2) --rebalance-warm $(COPY_HEADS) $(LE_8K) --out $(ROUTE)/le_g2wcd10_8k
	$(PY) scripts/dense_heads_sweep.py --adapter $(G2) --rebalance-warm --heads 6 \
		--specs induction:6+duplicate:2 induction:6+duplicate:4 induction:4+duplicate:4 \
		--out docs/results/dense_heads_duplicate_sweep.json
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-k8 $(COPY_HEADS) $(LE_FLAGS) $(LE_TOP1) \
		--out $(ROUTE)/le_k8c10_2k
	$(VENV)/bin/focusattn bench-model --adapter $(G2) --rebalance-warm $(COPY_HEADS) $(BM_TOP1) --out $(ROUTE)/bm_g2wcd10
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-k8 $(COPY_HEADS) $(BM_TOP1) --out $(ROUTE)/bm_k8c10
	cp $(ROUTE)/le_g2wcd10_2k/long_eval.json docs/results/long_eval_attention_g2_warm_copy10.json
	cp $(ROUTE)/le_g2wcd10_8k/long_eval.json docs/results/long_eval_attention_g2_warm_copy10_8k.json
	cp $(ROUTE)/le_k8c10_2k/long_eval.json docs/results/long_eval_k8_copy10.json
	for b in bm_g2wcd10:model_bench_attention_g2_warm_copy10 bm_k8c10:model_bench_k8_copy10; do \
		cp $(ROUTE)/$${b%%:*}/model_bench.json docs/results/$${b#*:}.json; \
		cp $(ROUTE)/$${b%%:*}/model_bench.png docs/results/$${b#*:}.png; done
	$(MAKE) results

# The attention-objective routers shipped by name (smollm2-135m-focus-g2), served with warm rebalancing, the
# group-size cap (FocusConfig.capacity) and the copy heads; measured by name, as a user loads it (2048 with every
# baseline + recall, 8192, whole-model speed), then shipped again with those tables on its card. ~1.5 h on 2 cores.
G2_RUN ?= $(patsubst %/adapter,%,$(G2))
G2_SERVE := --rebalance-warm --capacity 1.5 $(COPY_HEADS)
ship-g2: $(STAMP)
	$(VENV)/bin/focusattn ship-adapter $(G2_RUN) --name smollm2-135m-focus-g2 $(G2_SERVE)
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 $(LE_FLAGS) $(LE_TOP1) --out $(ROUTE)/le_g2ship_2k
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 $(LE_LONG) --out $(ROUTE)/le_g2ship_long
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 $(LE_8K_BASE) --baselines kmeans \
		--variants kmeans@top1 --out $(ROUTE)/le_g2ship_8k_kmeans
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 $(LE_8K_BASE) --baselines random,untrained \
		--variants random@top1,untrained@top1 --out $(ROUTE)/le_g2ship_8k_random
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-g2 $(BM_TOP1) --out $(ROUTE)/bm_g2ship
	cp $(ROUTE)/le_g2ship_2k/long_eval.json docs/results/long_eval_g2.json
	cp $(ROUTE)/le_g2ship_long/long_eval.json docs/results/long_eval_g2_long.json
	cp $(ROUTE)/le_g2ship_8k_kmeans/long_eval.json docs/results/long_eval_g2_8k_kmeans.json
	cp $(ROUTE)/le_g2ship_8k_random/long_eval.json docs/results/long_eval_g2_8k_random.json
	cp $(ROUTE)/bm_g2ship/model_bench.json docs/results/model_bench_g2.json
	cp $(ROUTE)/bm_g2ship/model_bench.png docs/results/model_bench_g2.png
	$(VENV)/bin/focusattn ship-adapter $(G2_RUN) --name smollm2-135m-focus-g2 $(G2_SERVE) \
		--long-eval docs/results/long_eval_g2.json --model-bench docs/results/model_bench_g2.json
	$(MAKE) results

# Issue 22, item 4: the shipped g2 routers trained on at 4096 tokens (twice the length they were trained at) on two
# registers (shakespeare + python-docs; news and python code held out), with the dense heads they are served with, so
# each router's targets are its layer's routed heads; a held-out curve every 100 steps. ~35 min on 2 cores (the
# targets of 8 windows, ~1 min each, kept in $(ROUTE)/targets4k), then long-eval at 2048 (every baseline + recall)
# and at 4096/8192 (perplexity, probes, recall; the baselines' rows at that budget are g2's, in ship-g2) with the cap
# g2 ships with. ~1.5 h in all.
G2L := $(ROUTE)/g2l4k
routing-long: $(STAMP) python-docs
	$(VENV)/bin/focusattn retrofit --objective attention --data shakespeare+python-docs --seq-len 4096 --pool 8 \
		--steps 400 --warmup 10 --lr 2e-3 --balance-loss 0.1 --attn-keys 64 --global-rate 0.02 --eval-windows 1 \
		--ood-eval-windows 1 --eval-top-k 1 --eval-every 100 --checkpoint-every 100 --rebalance 256 --rebalance-warm \
		--threads 1 --init-adapter smollm2-135m-focus-g2 --dense-heads induction:6+duplicate:4 \
		--targets-cache $(ROUTE)/targets4k --out $(G2L)
	cp $(G2L)/summary.json docs/results/retrofit_long_attention_g2l4k.json
	cp $(G2L)/metrics.jsonl docs/results/retrofit_long_attention_g2l4k.metrics.jsonl
	$(VENV)/bin/focusattn long-eval --adapter $(G2L)/adapter --capacity 1.5 $(LE_FLAGS) $(LE_TOP1) \
		--out $(ROUTE)/le_g2l_2k
	$(VENV)/bin/focusattn long-eval --adapter $(G2L)/adapter --capacity 1.5 $(LE_LONG) --variants original,top1 \
		--out $(ROUTE)/le_g2l_long
	cp $(ROUTE)/le_g2l_2k/long_eval.json docs/results/long_eval_attention_g2l4k.json
	cp $(ROUTE)/le_g2l_long/long_eval.json docs/results/long_eval_attention_g2l4k_long.json
	$(MAKE) results

# Issue 22, item 2: the query role's own projection (`--query-proj`, FocusConfig.query_proj), trained. The shipped g2
# routers continue at 2048 tokens on the same registers and windows with W_q started from W_g (so step 0 serves g2's
# groups) and the same dense heads, cap and warm rebalancing; a held-out curve every 100 steps. ~20 min on one core
# (the targets of 12 windows, ~20 s each, kept in $(ROUTE)/targets); then the same on g2's 24 windows at a third of
# the learning rate (~23 min; curve only), and long-eval of the first at 2048 (top-1 with the oracle, sliding and duo
# at its budget, recall) and at 4096/8192, as routing-long; last, how much any one partition into K groups could keep
# of those windows' attention (scripts/partition_oracle.py, ~1 min). ~1.5 h in all on 2 cores (DECISIONS: not shipped).
G2Q := $(ROUTE)/g2q
routing-qproj: $(STAMP) python-docs
	$(VENV)/bin/focusattn retrofit --objective attention --data shakespeare+python-docs --seq-len 2048 --pool 12 \
		--steps 300 --warmup 10 --lr 3e-3 --balance-loss 0.1 --attn-keys 64 --global-rate 0.02 --eval-windows 1 \
		--ood-eval-windows 1 --eval-top-k 1 --eval-every 100 --checkpoint-every 100 --rebalance 256 --rebalance-warm \
		--capacity 1.5 --query-proj --threads 1 --init-adapter smollm2-135m-focus-g2 \
		--dense-heads induction:6+duplicate:4 --targets-cache $(ROUTE)/targets --out $(G2Q)
	$(VENV)/bin/focusattn retrofit --objective attention --data shakespeare+python-docs --seq-len 2048 --pool 24 \
		--steps 300 --warmup 10 --lr 1e-3 --balance-loss 0.1 --attn-keys 64 --global-rate 0.02 --eval-windows 1 \
		--ood-eval-windows 1 --eval-top-k 1 --eval-every 100 --checkpoint-every 100 --rebalance 256 --rebalance-warm \
		--capacity 1.5 --query-proj --threads 1 --init-adapter smollm2-135m-focus-g2 \
		--dense-heads induction:6+duplicate:4 --targets-cache $(ROUTE)/targets --out $(G2Q)24
	cp $(G2Q)/summary.json docs/results/retrofit_long_attention_g2q.json
	cp $(G2Q)24/summary.json docs/results/retrofit_long_attention_g2q24.json
	cp $(G2Q)24/metrics.jsonl docs/results/retrofit_long_attention_g2q24.metrics.jsonl
	cp $(G2Q)/metrics.jsonl docs/results/retrofit_long_attention_g2q.metrics.jsonl
	$(VENV)/bin/focusattn long-eval --adapter $(G2Q)/adapter --capacity 1.5 $(LE_FLAGS) --top-k 1 \
		--baselines sliding,duo,oracle --variants original,top1,sliding@top1,duo@top1,oracle@top1 \
		--out $(ROUTE)/le_g2q_2k
	$(VENV)/bin/focusattn long-eval --adapter $(G2Q)/adapter --capacity 1.5 $(LE_LONG) --variants original,top1 \
		--out $(ROUTE)/le_g2q_long
	cp $(ROUTE)/le_g2q_2k/long_eval.json docs/results/long_eval_attention_g2q.json
	cp $(ROUTE)/le_g2q_long/long_eval.json docs/results/long_eval_attention_g2q_long.json
	$(PY) scripts/partition_oracle.py --targets $(ROUTE)/targets --windows 3 --out docs/results/partition_oracle.json
	$(MAKE) results

# Issue 22: a richer router input and an objective measured at a fixed budget, continued from the shipped g2 routers
# with the same dense heads, cap, warm rebalancing, registers and windows. The MLP router (FocusConfig.router_hidden,
# width 64, output weight at zero so step 0 serves g2's groups) beside a linear control on the cross-entropy, with a
# 10x balance loss, and on 48 windows for 800 steps; then the expected kept mass under window-balanced groups
# (--attn-loss mass), linear and MLP, and linear on 48 windows. Held-out curves; long-eval at 2048 (top-1 with the
# oracle at its budget, recall) of the first MLP and the mass routers, and at 4096/8192 of the longer mass run; then
# every router's served top-1 mask, capped and uncapped, by attention recall on three registers, two never trained
# on (scripts/router_recall.py).
# ~2.5 h on 2 cores (the targets of 48 windows, ~15 s each, kept in $(ROUTE)/targets). DECISIONS: not shipped.
ROUTE_MLP := --objective attention --data shakespeare+python-docs --seq-len 2048 --attn-keys 64 \
	--global-rate 0.02 --eval-windows 1 --ood-eval-windows 1 --eval-top-k 1 --rebalance 256 --rebalance-warm \
	--capacity 1.5 --threads 1 --init-adapter smollm2-135m-focus-g2 --dense-heads induction:6+duplicate:4 \
	--targets-cache $(ROUTE)/targets
ROUTE_MLP24 := $(ROUTE_MLP) --pool 24 --steps 300 --warmup 10 --lr 1e-3 --eval-every 100 --checkpoint-every 100
ROUTE_MLP48 := $(ROUTE_MLP) --pool 48 --steps 800 --warmup 20 --lr 2e-3 --eval-every 200 --checkpoint-every 200
ROUTE_RUNS := g2c24 g2m24 g2m24b g2m48 g2s24 g2ms24 g2s48
routing-mlp: $(STAMP) python-docs
	$(VENV)/bin/focusattn retrofit $(ROUTE_MLP24) --balance-loss 0.1 --out $(ROUTE)/g2c24
	$(VENV)/bin/focusattn retrofit $(ROUTE_MLP24) --balance-loss 0.1 --router-hidden 64 --out $(ROUTE)/g2m24
	$(VENV)/bin/focusattn retrofit $(ROUTE_MLP24) --balance-loss 1.0 --router-hidden 64 --out $(ROUTE)/g2m24b
	$(VENV)/bin/focusattn retrofit $(ROUTE_MLP48) --balance-loss 0.1 --router-hidden 64 --out $(ROUTE)/g2m48
	$(VENV)/bin/focusattn retrofit $(ROUTE_MLP24) --balance-loss 0.1 --attn-loss mass --out $(ROUTE)/g2s24
	$(VENV)/bin/focusattn retrofit $(ROUTE_MLP24) --balance-loss 0.1 --attn-loss mass --router-hidden 64 \
		--out $(ROUTE)/g2ms24
	$(VENV)/bin/focusattn retrofit $(ROUTE_MLP48) --balance-loss 0.1 --attn-loss mass --out $(ROUTE)/g2s48
	for r in $(ROUTE_RUNS); do cp $(ROUTE)/$$r/summary.json docs/results/retrofit_long_attention_$$r.json; \
		cp $(ROUTE)/$$r/metrics.jsonl docs/results/retrofit_long_attention_$$r.metrics.jsonl; done
	for r in g2m24 g2s24 g2s48; do $(VENV)/bin/focusattn long-eval --adapter $(ROUTE)/$$r/adapter $(LE_FLAGS) --top-k 1 \
		--baselines oracle --variants original,top1,oracle@top1 --out $(ROUTE)/le_$${r}_2k; \
		cp $(ROUTE)/le_$${r}_2k/long_eval.json docs/results/long_eval_attention_$$r.json; done
	$(VENV)/bin/focusattn long-eval --adapter $(ROUTE)/g2s48/adapter $(LE_LONG) --baselines oracle \
		--variants original,top1,oracle@top1 --out $(ROUTE)/le_g2s48_long
	cp $(ROUTE)/le_g2s48_long/long_eval.json docs/results/long_eval_attention_g2s48_long.json
	$(PY) scripts/router_recall.py --adapters smollm2-135m-focus-g2 $(patsubst %,$(ROUTE)/%/adapter,$(ROUTE_RUNS)) \
		--names g2 $(ROUTE_RUNS) --corpora shakespeare lee-news python-code --windows 2 \
		--out docs/results/router_recall.json
	$(MAKE) results

# The shipped g2 served with a wider local window at 8192 (FocusConfig.window overridden at serve time, --window):
# does the routing beyond a wider window beat the DuoAttention-style mask at the budget it then keeps? Two
# long-evals on one core each (~90 min together), the same without the dense heads (perplexity and probes, ~25 min),
# then the whole model's speed at 512 on a quiet machine (~7 min).
ROUTING_WINDOWS ?= 256 512
routing-window: $(STAMP)
	for w in $(ROUTING_WINDOWS); do \
		$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 --window $$w $(LE_8K_BASE) \
			--baselines sliding,duo,oracle --variants original,top1,sliding@top1,duo@top1,oracle@top1 \
			--out $(ROUTE)/le_g2_w$${w}_8k > $(ROUTE)/le_g2_w$$w.log 2>&1 & \
	done; wait
	for w in $(ROUTING_WINDOWS); do \
		cp $(ROUTE)/le_g2_w$${w}_8k/long_eval.json docs/results/long_eval_g2_w$${w}_8k.json; done
	for w in 384 512; do \
		$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 --window $$w --dense-heads none \
			$(LE_8K_BASE) --recall-windows 0 --baselines sliding --variants original,top1,sliding@top1 \
			--out $(ROUTE)/le_g2_w$${w}_nodense_8k > $(ROUTE)/le_g2_w$${w}_nodense.log 2>&1 & \
	done; wait
	for w in 384 512; do cp $(ROUTE)/le_g2_w$${w}_nodense_8k/long_eval.json \
		docs/results/long_eval_g2_w$${w}_nodense_8k.json; done
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-g2 --window 512 --lengths 8192 --top-k 1 \
		--repeats 1 --decode-tokens 8 --threads 1 --out $(ROUTE)/bm_g2_w512
	cp $(ROUTE)/bm_g2_w512/model_bench.json docs/results/model_bench_g2_w512.json
	cp $(ROUTE)/bm_g2_w512/model_bench.png docs/results/model_bench_g2_w512.png
	$(MAKE) results

# Routing in the layer's own key space (issue 22): the k-means baseline at the shipped g2's budget per query, long-
# evaluated at 2048 and 8192 (~10 and ~45 min on one core), and scripts/key_clusters_probe.py beside g2 and the
# oracle with centroids fitted per sequence or once on training text (~15 min with perplexity at 2048, ~25 min at
# 8192 without).
routing-keys: $(STAMP)
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 --lengths 2048 --ppl-windows 2 \
		--recall-windows 2 --passkey-per-depth 1 --repeat-n 1 --no-soft --top-k 1 --threads 1 \
		--baselines kmeans,oracle --variants kmeans@top1 --out $(ROUTE)/le_g2_kmeans_2k \
		> $(ROUTE)/le_g2_kmeans_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter smollm2-135m-focus-g2 $(LE_8K_BASE) \
		--baselines kmeans,oracle --variants kmeans@top1 --out $(ROUTE)/le_g2_kmeans_8k \
		> $(ROUTE)/le_g2_kmeans_8k.log 2>&1 & wait
	cp $(ROUTE)/le_g2_kmeans_2k/long_eval.json docs/results/long_eval_g2_kmeans.json
	cp $(ROUTE)/le_g2_kmeans_8k/long_eval.json docs/results/long_eval_g2_8k_kmeans.json
	$(PY) scripts/key_clusters_probe.py --length 2048 --windows 2 --fit-windows 2 --clusters 64 256 --ppl \
		--out docs/results/key_clusters_2k.json
	$(PY) scripts/key_clusters_probe.py --length 8192 --windows 1 --fit-windows 1 --clusters 256 \
		--corpora shakespeare lee-news --out docs/results/key_clusters_8k.json
	$(MAKE) results

# A served key-space router (issue 22; FocusConfig.router_input="keys"): centroids fitted by k-means on the frozen
# model's keys (fit-keys, 1-2 min each) with g2's dense heads and window, budget 0.15: 256 and 64 centroids fitted
# on 2048-token windows (long-evaluated at 2048, ~20 min each; their speed at 2048 and 8192 shows the 2048 fit
# crowding keys into a few groups at 8192), then 256 and 64 fitted at 8192, the default (long-evaluated at 8192,
# ~35 and ~15 min without recall, and 256 at 2048, ~20 min), each bench-model ~8 min; two runs at once, one core each.
KEYS_FIT := --budget 0.15 --dense-heads 7:2,8:0,14:1,15:2,17:1,18:2,20:2,23:0,23:2,24:1 --threads 1
KEYS_RUN ?= $(RUNS)/keys
LE_2K_KEYS := --lengths 2048 --ppl-windows 2 --recall-windows 2 --passkey-per-depth 1 --repeat-n 1 --no-soft \
	--top-k 1 --threads 1
BM_KEYS := --lengths 2048 8192 --top-k 1 --repeats 1 --decode-tokens 8 --threads 1
routing-keyspace: $(STAMP)
	$(VENV)/bin/focusattn fit-keys --groups 256 --length 2048 --windows 2 $(KEYS_FIT) --out $(KEYS_RUN)/k256
	$(VENV)/bin/focusattn fit-keys --groups 64 --length 2048 --windows 2 $(KEYS_FIT) --out $(KEYS_RUN)/k64
	$(VENV)/bin/focusattn fit-keys --groups 256 $(KEYS_FIT) --out $(KEYS_RUN)/k256L
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_RUN)/k256/adapter $(LE_2K_KEYS) \
		--baselines sliding,oracle,kmeans --out $(KEYS_RUN)/le_2k > $(KEYS_RUN)/le_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_RUN)/k64/adapter $(LE_2K_KEYS) \
		--baselines duo,oracle --out $(KEYS_RUN)/le64_2k > $(KEYS_RUN)/le64_2k.log 2>&1 & wait
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_RUN)/k256/adapter $(BM_KEYS) --out $(KEYS_RUN)/bm256
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_RUN)/k64/adapter $(BM_KEYS) --out $(KEYS_RUN)/bm64
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_RUN)/k256L/adapter $(LE_8K_BASE) --baselines oracle \
		--variants original,top1 --out $(KEYS_RUN)/leL_8k > $(KEYS_RUN)/leL_8k.log 2>&1 & \
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_RUN)/k256L/adapter $(BM_KEYS) --out $(KEYS_RUN)/bmL & wait
	$(VENV)/bin/focusattn fit-keys --groups 64 $(KEYS_FIT) --out $(KEYS_RUN)/k64L
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_RUN)/k64L/adapter $(BM_KEYS) --out $(KEYS_RUN)/bm64L
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_RUN)/k256L/adapter $(LE_2K_KEYS) --baselines duo,oracle \
		--out $(KEYS_RUN)/leL_2k > $(KEYS_RUN)/leL_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_RUN)/k64L/adapter $(LE_8K_BASE) --recall-windows 0 \
		--baselines oracle --variants original,top1 --out $(KEYS_RUN)/le64L_8k > $(KEYS_RUN)/le64L_8k.log 2>&1 & wait
	cp $(KEYS_RUN)/le_2k/long_eval.json docs/results/long_eval_keys256.json
	cp $(KEYS_RUN)/le64_2k/long_eval.json docs/results/long_eval_keys64.json
	cp $(KEYS_RUN)/leL_8k/long_eval.json docs/results/long_eval_keys256L_8k.json
	cp $(KEYS_RUN)/leL_2k/long_eval.json docs/results/long_eval_keys256L.json
	cp $(KEYS_RUN)/bm256/model_bench.json docs/results/model_bench_keys256.json
	cp $(KEYS_RUN)/bm64/model_bench.json docs/results/model_bench_keys64.json
	cp $(KEYS_RUN)/bmL/model_bench.json docs/results/model_bench_keys256L.json
	cp $(KEYS_RUN)/bm64L/model_bench.json docs/results/model_bench_keys64L.json
	cp $(KEYS_RUN)/le64L_8k/long_eval.json docs/results/long_eval_keys64L_8k.json
	$(MAKE) results

# The shipped key-space adapter (issue 22): k256L's centroids (256 per layer, fitted at 8192 tokens, ~3 min) served
# at budget 0.12 (24% of the causal pairs at 8192), long-evaluated by name at 2048 + 4096 (~40 min: two recall
# windows at each) and 8192 (~50 min) against the window, DuoAttention-style, k-means and oracle masks at its budget,
# its random baseline at both (~15 min), whole-model speed (~8 min); two runs at once, one core each.
KEYS_SHIP := smollm2-135m-focus-keys256
SHIP_RUN ?= $(RUNS)/ship
ship-keys: $(STAMP) python-docs
	mkdir -p $(SHIP_RUN)
	$(VENV)/bin/focusattn fit-keys --groups 256 $(KEYS_FIT) --out $(KEYS_RUN)/k256L
	$(VENV)/bin/focusattn ship-adapter $(KEYS_RUN)/k256L --name $(KEYS_SHIP) --budget 0.12
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_SHIP) --lengths 2048 4096 --ppl-windows 2 --recall-windows 2 \
		--passkey-per-depth 1 --repeat-n 1 --no-soft --top-k 1 --threads 1 --baselines sliding,duo,kmeans,oracle \
		--out $(SHIP_RUN)/le_keys256_2k > $(SHIP_RUN)/le_keys256_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_SHIP) $(LE_8K_BASE) --baselines sliding,duo,kmeans,oracle \
		--out $(SHIP_RUN)/le_keys256_8k > $(SHIP_RUN)/le_keys256_8k.log 2>&1 & wait
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_SHIP) $(LE_8K_BASE) --recall-windows 0 --baselines random \
		--variants random@top1 --out $(SHIP_RUN)/le_keys256_8k_random > $(SHIP_RUN)/le_keys256_8k_random.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_SHIP) $(LE_2K_KEYS) --recall-windows 0 --baselines random \
		--variants random@top1 --out $(SHIP_RUN)/le_keys256_2k_random > $(SHIP_RUN)/le_keys256_2k_random.log 2>&1 & wait
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_SHIP) $(BM_KEYS) --out $(SHIP_RUN)/bm_keys256
	@# beside it: 256 against 64 centroids at the same budget (8192), and k64L's speed with the block engine
	$(VENV)/bin/focusattn fit-keys --groups 64 $(KEYS_FIT) --out $(KEYS_RUN)/k64L
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_RUN)/k256L/adapter --budget 0.12 $(LE_8K_BASE) --baselines oracle \
		--variants original,top1 --out $(KEYS_RUN)/le256L_b12_8k > $(KEYS_RUN)/le256L_b12_8k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_RUN)/k64L/adapter --budget 0.12 $(LE_8K_BASE) --baselines oracle \
		--variants original,top1 --out $(KEYS_RUN)/le64L_b12_8k > $(KEYS_RUN)/le64L_b12_8k.log 2>&1 & wait
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_RUN)/k64L/adapter $(BM_KEYS) --out $(KEYS_RUN)/bm64L_blocks
	cp $(KEYS_RUN)/le256L_b12_8k/long_eval.json docs/results/long_eval_keys256L_b12_8k.json
	cp $(KEYS_RUN)/le64L_b12_8k/long_eval.json docs/results/long_eval_keys64L_b12_8k.json
	cp $(KEYS_RUN)/bm64L_blocks/model_bench.json docs/results/model_bench_keys64L_blocks.json
	cp $(KEYS_RUN)/bm64L_blocks/model_bench.png docs/results/model_bench_keys64L_blocks.png
	cp $(SHIP_RUN)/le_keys256_2k/long_eval.json docs/results/long_eval_keys256_ship.json
	cp $(SHIP_RUN)/le_keys256_8k/long_eval.json docs/results/long_eval_keys256_ship_8k.json
	cp $(SHIP_RUN)/le_keys256_8k_random/long_eval.json docs/results/long_eval_keys256_ship_8k_random.json
	cp $(SHIP_RUN)/le_keys256_2k_random/long_eval.json docs/results/long_eval_keys256_ship_random.json
	cp $(SHIP_RUN)/bm_keys256/model_bench.json docs/results/model_bench_keys256_ship.json
	cp $(SHIP_RUN)/bm_keys256/model_bench.png docs/results/model_bench_keys256_ship.png
	$(VENV)/bin/focusattn ship-adapter $(KEYS_RUN)/k256L --name $(KEYS_SHIP) --budget 0.12 \
		--long-eval docs/results/long_eval_keys256_ship.json docs/results/long_eval_keys256_ship_8k.json \
		docs/results/long_eval_keys256_ship_random.json docs/results/long_eval_keys256_ship_8k_random.json \
		--model-bench docs/results/model_bench_keys256_ship.json
	$(MAKE) results

# The shipped keys256's centroids served with key_scores=means (issue 22: groups scored by the running means of the
# sequence's own keys, the centroid one more key), shipped as its own name, long-evaluated by that name at 2048 +
# 4096 (~40 min) and 8192 (~45 min) beside the oracle at its budget, six passkey trials each, one core each; then
# its whole-model speed and, in the next run, keys256's again (alone, ~9 min each: both against the original, two
# alternated rounds each: one round of each differed by 10% on one morning).
KEYS_MEANS := smollm2-135m-focus-keys256-means
BM_KEYS2 := --lengths 2048 8192 --top-k 1 --repeats 2 --decode-tokens 8 --threads 1
ship-means: $(STAMP)
	mkdir -p $(SHIP_RUN)
	$(VENV)/bin/focusattn ship-adapter $(KEYS_SHIP) --name $(KEYS_MEANS) --key-scores means
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --lengths 2048 4096 --ppl-max-len 2048 --ppl-windows 2 \
		--recall-windows 2 --passkey-per-depth 2 --repeat-n 2 --no-soft --top-k 1 --threads 1 --baselines oracle \
		--variants original,top1,oracle@top1 --out $(SHIP_RUN)/le_means_2k > $(SHIP_RUN)/le_means_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --lengths 8192 --ppl-max-len 8192 --ppl-windows 1 \
		--recall-windows 1 --passkey-per-depth 2 --repeat-n 1 --no-soft --top-k 1 --threads 1 --baselines oracle \
		--variants original,top1,oracle@top1 --out $(SHIP_RUN)/le_means_8k > $(SHIP_RUN)/le_means_8k.log 2>&1 & wait
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_MEANS) $(BM_KEYS2) --out $(SHIP_RUN)/bm_keys256_means
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_SHIP) $(BM_KEYS2) --out $(SHIP_RUN)/bm_keys256_today
	cp $(SHIP_RUN)/le_means_2k/long_eval.json docs/results/long_eval_keys256_means_ship.json
	cp $(SHIP_RUN)/le_means_8k/long_eval.json docs/results/long_eval_keys256_means_ship_8k.json
	cp $(SHIP_RUN)/bm_keys256_means/model_bench.json docs/results/model_bench_keys256_means.json
	cp $(SHIP_RUN)/bm_keys256_means/model_bench.png docs/results/model_bench_keys256_means.png
	cp $(SHIP_RUN)/bm_keys256_today/model_bench.json docs/results/model_bench_keys256_ship.json
	cp $(SHIP_RUN)/bm_keys256_today/model_bench.png docs/results/model_bench_keys256_ship.png
	$(VENV)/bin/focusattn ship-adapter $(KEYS_SHIP) --name $(KEYS_MEANS) --key-scores means \
		--long-eval docs/results/long_eval_keys256_means_ship.json docs/results/long_eval_keys256_means_ship_8k.json \
		--model-bench docs/results/model_bench_keys256_means.json
	$(VENV)/bin/focusattn ship-adapter $(KEYS_SHIP) --refresh-card \
		--long-eval docs/results/long_eval_keys256_ship.json docs/results/long_eval_keys256L_b12_8k.json \
		docs/results/long_eval_keys256_ship_random.json docs/results/long_eval_keys256_ship_8k_random.json \
		--model-bench docs/results/model_bench_keys256_ship.json
	$(MAKE) results

# The shipped key-space adapters on a register outside their centroids' fit (Python source from the standard
# library; fitted on Shakespeare and the Python docs), passkeys hidden in that code, against the window, random,
# k-means and oracle masks at the same budget (~35 min at 2048, ~100 min at 8192 on one core each, in parallel), and
# means at a 15% budget (~10 min);
# then both adapters' whole-model speed on this machine's CPU (alone, ~10 min each; the chip is recorded).
CODE_RUN ?= runs/code
registers: $(STAMP)
	mkdir -p $(CODE_RUN) $(SHIP_RUN)
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --lengths 2048 --ppl-max-len 2048 --ppl-windows 2 \
		--recall-windows 1 --passkey-per-depth 2 --repeat-n 2 --no-soft --top-k 1 --threads 1 --data shakespeare \
		--ood-data python-code --baselines sliding,random,kmeans,oracle --out $(CODE_RUN)/le_means_2k \
		> $(CODE_RUN)/le_means_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_SHIP) --lengths 2048 --ppl-max-len 2048 --ppl-windows 2 \
		--recall-windows 1 --passkey-per-depth 2 --repeat-n 2 --no-soft --top-k 1 --threads 1 --data shakespeare \
		--ood-data python-code --baselines oracle --variants original,top1,oracle@top1 \
		--out $(CODE_RUN)/le_keys256_2k > $(CODE_RUN)/le_keys256_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --lengths 8192 --ppl-max-len 8192 --ppl-windows 1 \
		--recall-windows 1 --passkey-per-depth 2 --repeat-n 1 --no-soft --top-k 1 --threads 1 --data shakespeare \
		--ood-data python-code --baselines sliding,kmeans,oracle --out $(CODE_RUN)/le_means_8k \
		> $(CODE_RUN)/le_means_8k.log 2>&1 & wait
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --budget 0.15 --lengths 2048 --ppl-max-len 2048 \
		--ppl-windows 2 --recall-windows 0 --passkey-per-depth 2 --repeat-n 2 --no-soft --top-k 1 --threads 1 \
		--data shakespeare --ood-data python-code --baselines '' --variants original,top1 \
		--out $(CODE_RUN)/le_means_b15_2k > $(CODE_RUN)/le_means_b15_2k.log 2>&1
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_MEANS) $(BM_KEYS2) --out $(SHIP_RUN)/bm_means_amx
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_SHIP) $(BM_KEYS2) --out $(SHIP_RUN)/bm_keys256_amx
	cp $(CODE_RUN)/le_means_2k/long_eval.json docs/results/register_eval_keys256_means_code.json
	cp $(CODE_RUN)/le_means_8k/long_eval.json docs/results/register_eval_keys256_means_code_8k.json
	cp $(CODE_RUN)/le_keys256_2k/long_eval.json docs/results/register_eval_keys256_code.json
	cp $(CODE_RUN)/le_means_b15_2k/long_eval.json docs/results/register_eval_keys256_means_b15_code.json
	cp $(SHIP_RUN)/bm_means_amx/model_bench.json docs/results/model_bench_keys256_means_amx.json
	cp $(SHIP_RUN)/bm_means_amx/model_bench.png docs/results/model_bench_keys256_means_amx.png
	cp $(SHIP_RUN)/bm_keys256_amx/model_bench.json docs/results/model_bench_keys256_ship_amx.json
	cp $(SHIP_RUN)/bm_keys256_amx/model_bench.png docs/results/model_bench_keys256_ship_amx.png
	$(MAKE) results

# Every shipped adapter's whole-model speed at 8192 on one machine in one session (the README table's speed column
# had rows from two chips): alone and in turn, each against the original in its own run (~40 min on one core; keep
# the machine otherwise quiet). DAY names the session's JSON so it sorts after older runs of the same adapter.
DAY ?= 1206
BM_8K := --lengths 8192 --repeats 2 --decode-tokens 8 --threads 1
bench-ship: $(STAMP)
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-k8 --top-k 1 2 $(BM_8K) --out $(RUNS)/ship$(DAY)/k8
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-g2 --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/g2
	$(VENV)/bin/focusattn bench-model --adapter smollm2-135m-focus-g2 --window 512 --top-k 1 $(BM_8K) \
		--out $(RUNS)/ship$(DAY)/g2_w512
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_SHIP) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_ship
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_MEANS) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_means
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_UNION) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_union
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_FLOOR) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_floor
	for n in k8 g2 g2_w512 keys256_ship keys256_means keys256_union keys256_floor; do for x in json png; do \
		cp $(RUNS)/ship$(DAY)/$$n/model_bench.$$x docs/results/model_bench_$${n}_amx_$(DAY).$$x; done; done
	$(MAKE) results

# Flags of the shipped names' long-evals (ship-union, ship-floor): 2048/4096 and 8192 on the default registers,
# Python source as the other register, with the oracle at the adapter's budget or without baselines.
LE_SHIP_2K := --lengths 2048 4096 --ppl-max-len 2048 --ppl-windows 2 --recall-windows 2 --passkey-per-depth 2 \
	--repeat-n 2 --no-soft --top-k 1 --threads 1
LE_SHIP_8K := --lengths 8192 --ppl-max-len 8192 --ppl-windows 1 --recall-windows 1 --passkey-per-depth 2 \
	--repeat-n 1 --no-soft --top-k 1 --threads 1
LE_CODE_2K := --lengths 2048 --ppl-max-len 2048 --ppl-windows 2 --recall-windows 1 --passkey-per-depth 2 --repeat-n 2 \
	--no-soft --top-k 1 --threads 1 --data shakespeare --ood-data python-code
LE_CODE_8K := $(LE_SHIP_8K) --data shakespeare --ood-data python-code
WITH_ORACLE := --baselines oracle --variants original,top1,oracle@top1
NO_BASE := --baselines '' --variants original,top1

# Queries keep their block's groups (FocusConfig.union_block; issue 22): keys256-means' centroids at a 4% budget,
# each query also keeping the groups its 64-token block's earlier queries and the block before joined, which the
# keyed engine computes anyway. The block-union probe at 2048 (~5 min), the shipped name's long-eval on news and on
# Python source at 2048 and 8192 (two at a time, ~15 min at 2048, ~60 min at 8192 with the oracle's passkeys, ~30
# without), then its speed and keys256-means' in one quiet session (~6 min each), and the card.
KEYS_UNION := smollm2-135m-focus-keys256-union
UNION_RUN ?= $(RUNS)/union
ship-union: $(STAMP)
	mkdir -p $(SHIP_RUN) $(UNION_RUN)
	$(VENV)/bin/python scripts/block_union_probe.py --length 2048 --windows 1 --budgets 0.03 0.05 0.07 \
		--out docs/results/block_union_2k.json
	$(VENV)/bin/focusattn ship-adapter $(KEYS_MEANS) --name $(KEYS_UNION) --budget 0.04 --union-block 64
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_UNION) $(LE_SHIP_2K) $(WITH_ORACLE) \
		--out $(SHIP_RUN)/le_union_2k > $(SHIP_RUN)/le_union_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_UNION) $(LE_CODE_2K) $(WITH_ORACLE) \
		--out $(UNION_RUN)/le_union_code_2k > $(UNION_RUN)/le_union_code_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_UNION) $(LE_SHIP_8K) $(WITH_ORACLE) \
		--out $(SHIP_RUN)/le_union_8k > $(SHIP_RUN)/le_union_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_UNION) $(LE_CODE_8K) $(NO_BASE) \
		--out $(UNION_RUN)/le_union_code_8k > $(UNION_RUN)/le_union_code_8k.log 2>&1 & wait
	for b in 03 05; do $(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --budget 0.$$b --union-block 64 \
		$(LE_CODE_2K) $(WITH_ORACLE) --out $(UNION_RUN)/le_u$${b}_code_2k > $(UNION_RUN)/le_u$$b.log 2>&1 && \
		cp $(UNION_RUN)/le_u$${b}_code_2k/long_eval.json \
		docs/results/register_eval_keys256_means_union_b$${b}_code.json; done & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --budget 0.05 --union-block 64 $(LE_SHIP_8K) $(NO_BASE) \
		--out $(UNION_RUN)/le_u05_8k > $(UNION_RUN)/le_u05_8k.log 2>&1 & wait
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --budget 0.05 --union-block 64 $(LE_SHIP_2K) \
		$(WITH_ORACLE) --out $(UNION_RUN)/le_u05_2k > $(UNION_RUN)/le_u05_2k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_MEANS) --budget 0.05 --union-block 64 $(LE_CODE_8K) $(NO_BASE) \
		--out $(UNION_RUN)/le_u05_code_8k > $(UNION_RUN)/le_u05_code_8k.log 2>&1 & wait
	cp $(UNION_RUN)/le_u05_8k/long_eval.json docs/results/long_eval_keys256_means_union_b05_8k.json
	cp $(UNION_RUN)/le_u05_2k/long_eval.json docs/results/long_eval_keys256_means_union_b05.json
	cp $(UNION_RUN)/le_u05_code_8k/long_eval.json docs/results/register_eval_keys256_means_union_b05_code_8k.json
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_UNION) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_union
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_MEANS) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_means
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_MEANS) --budget 0.05 --union-block 64 --top-k 1 $(BM_8K) \
		--out $(RUNS)/ship$(DAY)/keys256_means_union_b05
	for n in keys256_union keys256_means keys256_means_union_b05; do for x in json png; do \
		cp $(RUNS)/ship$(DAY)/$$n/model_bench.$$x docs/results/model_bench_$${n}_amx_$(DAY).$$x; done; done
	cp $(SHIP_RUN)/le_union_2k/long_eval.json docs/results/long_eval_keys256_union_ship.json
	cp $(SHIP_RUN)/le_union_8k/long_eval.json docs/results/long_eval_keys256_union_ship_8k.json
	cp $(UNION_RUN)/le_union_code_2k/long_eval.json docs/results/register_eval_keys256_union_code.json
	cp $(UNION_RUN)/le_union_code_8k/long_eval.json docs/results/register_eval_keys256_union_code_8k.json
	$(VENV)/bin/focusattn ship-adapter $(KEYS_MEANS) --name $(KEYS_UNION) --budget 0.04 --union-block 64 \
		--long-eval docs/results/long_eval_keys256_union_ship.json docs/results/long_eval_keys256_union_ship_8k.json \
		--model-bench docs/results/model_bench_keys256_union_amx_$(DAY).json
	$(MAKE) results

# A floor under the budget (FocusConfig.min_keys; issue 22): keys256-union with at least 128 distant keys a query (a
# 4% share is a group or two at 2048). Long-evals by name (2048/4096 and 8192 with the oracle, Python source at 2048
# and 8192), the same floor at a 3% share at 8192, then floor and union benched in one quiet session (~65 min on two
# cores, the benches ~12 min alone).
KEYS_FLOOR := smollm2-135m-focus-keys256-floor
FLOOR_RUN ?= $(RUNS)/floor
ship-floor: $(STAMP)
	mkdir -p $(FLOOR_RUN) $(RUNS)/mink
	$(VENV)/bin/focusattn ship-adapter $(KEYS_UNION) --name $(KEYS_FLOOR) --min-keys 128
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_SHIP_8K) $(WITH_ORACLE) \
		--out $(FLOOR_RUN)/le_floor_8k > $(FLOOR_RUN)/le_floor_8k.log 2>&1 & \
	( $(VENV)/bin/focusattn long-eval --adapter $(KEYS_UNION) --budget 0.03 --min-keys 128 $(LE_SHIP_8K) $(NO_BASE) \
		--out $(RUNS)/mink/le_b03m128_8k \
		> $(RUNS)/mink/le_b03m128_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_SHIP_2K) $(WITH_ORACLE) \
		--out $(FLOOR_RUN)/le_floor_2k > $(FLOOR_RUN)/le_floor_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_CODE_2K) $(WITH_ORACLE) \
		--out $(FLOOR_RUN)/le_floor_code_2k > $(FLOOR_RUN)/le_floor_code_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_CODE_8K) $(NO_BASE) \
		--out $(FLOOR_RUN)/le_floor_code_8k > $(FLOOR_RUN)/le_floor_code_8k.log 2>&1 ) & wait
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_FLOOR) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_floor
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_UNION) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_union
	for n in keys256_floor keys256_union; do for x in json png; do \
		cp $(RUNS)/ship$(DAY)/$$n/model_bench.$$x docs/results/model_bench_$${n}_amx_$(DAY).$$x; done; done
	cp $(FLOOR_RUN)/le_floor_2k/long_eval.json docs/results/long_eval_keys256_floor_ship.json
	cp $(FLOOR_RUN)/le_floor_8k/long_eval.json docs/results/long_eval_keys256_floor_ship_8k.json
	cp $(FLOOR_RUN)/le_floor_code_2k/long_eval.json docs/results/register_eval_keys256_floor_code.json
	cp $(FLOOR_RUN)/le_floor_code_8k/long_eval.json docs/results/register_eval_keys256_floor_code_8k.json
	cp $(RUNS)/mink/le_b03m128_8k/long_eval.json docs/results/long_eval_keys256_union_b03_min128_8k.json
	$(VENV)/bin/focusattn ship-adapter $(KEYS_UNION) --name $(KEYS_FLOOR) --min-keys 128 \
		--long-eval docs/results/long_eval_keys256_floor_ship.json docs/results/long_eval_keys256_floor_ship_8k.json \
		--model-bench docs/results/model_bench_keys256_floor_amx_$(DAY).json
	$(MAKE) results

# The floor's training-free baselines at its budget (issue 22): the window, random groups and per-sequence k-means
# keys, each keeping as many keys as keys256-floor (k-means and random query by query), at 8192 (~60 min on one
# core: the k-means rows run the dense reference) and 2048/4096, then on Python source at 2048 (~40 and ~25 min),
# two runs at once. The committed 8192 rows came from a run whose random baseline was still a random routing served
# with the block union (RESULTS shows it as `random-union`, as budget_matched renames it); its random rows at the
# router's count per query are a run of their own (~45 min).
FLOOR_BASE := --baselines sliding,random,kmeans --variants sliding@top1,random@top1,kmeans@top1
floor-baselines: $(STAMP)
	mkdir -p $(FLOOR_RUN)
	( $(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_SHIP_8K) $(FLOOR_BASE) \
		--out $(FLOOR_RUN)/le_base_8k > $(FLOOR_RUN)/le_base_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_SHIP_8K) --baselines random --variants random@top1 \
		--out $(FLOOR_RUN)/le_random_8k > $(FLOOR_RUN)/le_random_8k.log 2>&1 ) & \
	( $(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_SHIP_2K) $(FLOOR_BASE) \
		--out $(FLOOR_RUN)/le_base_2k > $(FLOOR_RUN)/le_base_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) $(LE_CODE_2K) $(FLOOR_BASE) \
		--out $(FLOOR_RUN)/le_base_code_2k > $(FLOOR_RUN)/le_base_code_2k.log 2>&1 ) & wait
	cp $(FLOOR_RUN)/le_base_8k/long_eval.json docs/results/long_eval_keys256_floor_ship_8k_baselines.json
	cp $(FLOOR_RUN)/le_random_8k/long_eval.json docs/results/long_eval_keys256_floor_ship_8k_random.json
	cp $(FLOOR_RUN)/le_base_2k/long_eval.json docs/results/long_eval_keys256_floor_ship_baselines.json
	cp $(FLOOR_RUN)/le_base_code_2k/long_eval.json docs/results/register_eval_keys256_floor_code_baselines.json
	$(MAKE) results

# The floor and the union benched again after the keyed engine took the sinks into its own calls and cut its CPU
# chunks to 1 << 22 scores (the same masks), alone and in turn (~14 min on one core; keep the machine quiet), then
# the floor's card with its baselines. DAY=1206b on the day of the earlier benches.
bench-keyed: $(STAMP)
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_FLOOR) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_floor
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_UNION) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_union
	for n in keys256_floor keys256_union; do for x in json png; do \
		cp $(RUNS)/ship$(DAY)/$$n/model_bench.$$x docs/results/model_bench_$${n}_amx_$(DAY).$$x; done; done
	$(VENV)/bin/focusattn ship-adapter $(KEYS_UNION) --name $(KEYS_FLOOR) --min-keys 128 \
		--long-eval docs/results/long_eval_keys256_floor_ship.json docs/results/long_eval_keys256_floor_ship_8k.json \
		docs/results/long_eval_keys256_floor_ship_baselines.json docs/results/long_eval_keys256_floor_ship_8k_baselines.json \
		docs/results/long_eval_keys256_floor_ship_8k_random.json \
		--model-bench docs/results/model_bench_keys256_floor_amx_$(DAY).json
	$(MAKE) results

# The floor with queries keeping the groups of 32-token blocks instead of 64 (`--union-block 32`; issue 22's 25% of
# the pairs): its own rows at 2048/4096, on Python source at 2048 and at 8192, beside the original rows of the
# floor's runs on the same windows (~10 min, two at once), then its speed alone (~6 min; keep the machine quiet).
LE_FLOOR_2K := --lengths 2048 4096 --ppl-max-len 2048 --ppl-windows 2 --recall-windows 0 --passkey-per-depth 2 \
	--repeat-n 2 --no-soft --top-k 1 --threads 1 --baselines '' --variants top1
LE_FLOOR_8K := --lengths 8192 --ppl-max-len 8192 --ppl-windows 1 --recall-windows 0 --passkey-per-depth 2 --repeat-n 1 \
	--no-soft --top-k 1 --threads 1 --baselines '' --variants top1
floor-union32: $(STAMP)
	mkdir -p $(RUNS)/u32
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) --union-block 32 $(LE_FLOOR_8K) --out $(RUNS)/u32/le_8k \
		> $(RUNS)/u32/le_8k.log 2>&1 & \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) --union-block 32 $(LE_FLOOR_2K) --out $(RUNS)/u32/le_2k \
		> $(RUNS)/u32/le_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR) --union-block 32 $(LE_CODE_2K) --recall-windows 0 \
		--baselines '' --variants top1 --out $(RUNS)/u32/le_code_2k > $(RUNS)/u32/le_code_2k.log 2>&1 & wait
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_FLOOR) --union-block 32 --top-k 1 $(BM_8K) \
		--out $(RUNS)/ship$(DAY)/keys256_floor_u32
	cp $(RUNS)/u32/le_8k/long_eval.json docs/results/long_eval_keys256_floor_union32_8k.json
	cp $(RUNS)/u32/le_2k/long_eval.json docs/results/long_eval_keys256_floor_union32.json
	cp $(RUNS)/u32/le_code_2k/long_eval.json docs/results/register_eval_keys256_floor_union32_code.json
	for x in json png; do cp $(RUNS)/ship$(DAY)/keys256_floor_u32/model_bench.$$x \
		docs/results/model_bench_keys256_floor_union32_amx_$(DAY).$$x; done
	$(MAKE) results

# The floor with 32-token union blocks, shipped by name (issue 22): keys256-floor's centroids and floor, each query also
# keeping the groups its 32-token block's earlier queries and the block before joined. Long-evals by name: 8192 with
# the oracle, then k-means, then the window and random groups at its budget (~140 min: the masked passkeys take
# ~4 min each), beside 2048/4096 and Python source at 2048 with the
# oracle and with the three baselines, then Python source at 8192 (~100 min); then its speed and the floor's in one
# quiet session (~12 min alone), and the card.
KEYS_FLOOR32 := smollm2-135m-focus-keys256-floor32
FLOOR32_RUN ?= $(RUNS)/floor32
ship-floor32: $(STAMP)
	mkdir -p $(FLOOR32_RUN)
	$(VENV)/bin/focusattn ship-adapter $(KEYS_FLOOR) --name $(KEYS_FLOOR32) --union-block 32
	( $(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_SHIP_8K) $(WITH_ORACLE) \
		--out $(FLOOR32_RUN)/le_8k > $(FLOOR32_RUN)/le_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_SHIP_8K) --baselines kmeans --variants kmeans@top1 \
		--out $(FLOOR32_RUN)/le_base_8k > $(FLOOR32_RUN)/le_base_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_SHIP_8K) --baselines sliding,random \
		--variants sliding@top1,random@top1 --out $(FLOOR32_RUN)/le_base_sr_8k \
		> $(FLOOR32_RUN)/le_base_sr_8k.log 2>&1 ) & \
	( $(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_SHIP_2K) $(WITH_ORACLE) \
		--out $(FLOOR32_RUN)/le_2k > $(FLOOR32_RUN)/le_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_CODE_2K) $(WITH_ORACLE) \
		--out $(FLOOR32_RUN)/le_code_2k > $(FLOOR32_RUN)/le_code_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_SHIP_2K) $(FLOOR_BASE) \
		--out $(FLOOR32_RUN)/le_base_2k > $(FLOOR32_RUN)/le_base_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_CODE_2K) $(FLOOR_BASE) \
		--out $(FLOOR32_RUN)/le_base_code_2k > $(FLOOR32_RUN)/le_base_code_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) $(LE_CODE_8K) $(NO_BASE) \
		--out $(FLOOR32_RUN)/le_code_8k > $(FLOOR32_RUN)/le_code_8k.log 2>&1 ) & wait
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_FLOOR32) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_floor32
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_FLOOR) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_floor
	for n in keys256_floor32 keys256_floor; do for x in json png; do \
		cp $(RUNS)/ship$(DAY)/$$n/model_bench.$$x docs/results/model_bench_$${n}_amx_$(DAY).$$x; done; done
	cp $(FLOOR32_RUN)/le_8k/long_eval.json docs/results/long_eval_keys256_floor32_ship_8k.json
	cp $(FLOOR32_RUN)/le_base_8k/long_eval.json docs/results/long_eval_keys256_floor32_ship_8k_baselines.json
	cp $(FLOOR32_RUN)/le_base_sr_8k/long_eval.json docs/results/long_eval_keys256_floor32_ship_8k_baselines_sr.json
	cp $(FLOOR32_RUN)/le_2k/long_eval.json docs/results/long_eval_keys256_floor32_ship.json
	cp $(FLOOR32_RUN)/le_base_2k/long_eval.json docs/results/long_eval_keys256_floor32_ship_baselines.json
	cp $(FLOOR32_RUN)/le_code_2k/long_eval.json docs/results/register_eval_keys256_floor32_code.json
	cp $(FLOOR32_RUN)/le_base_code_2k/long_eval.json docs/results/register_eval_keys256_floor32_code_baselines.json
	cp $(FLOOR32_RUN)/le_code_8k/long_eval.json docs/results/register_eval_keys256_floor32_code_8k.json
	$(VENV)/bin/focusattn ship-adapter $(KEYS_FLOOR) --name $(KEYS_FLOOR32) --union-block 32 \
		--long-eval docs/results/long_eval_keys256_floor32_ship.json docs/results/long_eval_keys256_floor32_ship_8k.json \
		--model-bench docs/results/model_bench_keys256_floor32_amx_$(DAY).json
	$(MAKE) results

# A retrieval head beside the dense ones (issue 22; DECISIONS, "A retrieval head"): floor32 with key/value head 1 of
# layer 19 served dense too, at 2048/4096 and 8192, and at 8192 with a 3.5% share (perplexity and probes only, with
# the original rows of ship-floor32's runs on the same windows; ~20 min on one core).
H19_HEADS := 7:2,8:0,14:1,15:2,17:1,18:2,19:1,20:2,23:0,23:2,24:1
floor32-h19: $(STAMP)
	mkdir -p $(RUNS)/h19
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) --dense-heads $(H19_HEADS) $(LE_FLOOR_2K) \
		--out $(RUNS)/h19/le_2k > $(RUNS)/h19/le_2k.log 2>&1
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) --dense-heads $(H19_HEADS) $(LE_FLOOR_8K) \
		--out $(RUNS)/h19/le_8k > $(RUNS)/h19/le_8k.log 2>&1
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) --dense-heads $(H19_HEADS) --budget 0.035 $(LE_FLOOR_8K) \
		--out $(RUNS)/h19/le_8k_b035 > $(RUNS)/h19/le_8k_b035.log 2>&1
	cp $(RUNS)/h19/le_2k/long_eval.json docs/results/long_eval_keys256_floor32_h19.json
	cp $(RUNS)/h19/le_8k/long_eval.json docs/results/long_eval_keys256_floor32_h19_8k.json
	cp $(RUNS)/h19/le_8k_b035/long_eval.json docs/results/long_eval_keys256_floor32_h19_b035_8k.json
	$(MAKE) results

# Is (19, 1) a retrieval head by anything but the probe it was found on? (issue 22; DECISIONS, "A retrieval head")
# Its ranks among the routed heads by copy scores, natural-text induction, a needle retrieval score, the attention
# the mask drops and the copy loss it saves served dense, all on training text (scripts/head_ranks.py, ~25 min);
# then, at a 3% share (25% of the pairs at 8192), beside the head the attention measures rank first (21:2) and the
# next scored copy head (--dense-heads induction:7+duplicate:4), at 2048/4096 and 8192 (perplexity and probes,
# ~10 min a run on one core).
H21_HEADS := 7:2,8:0,14:1,15:2,17:1,18:2,20:2,21:2,23:0,23:2,24:1
HEADS11 := h19_2k:$(H19_HEADS) h21_2k:$(H21_HEADS) i7_2k:induction:7+duplicate:4 h19_8k:$(H19_HEADS) \
	i7_8k:induction:7+duplicate:4
floor32-heads: $(STAMP)
	mkdir -p $(RUNS)/heads11
	$(PY) scripts/head_ranks.py --adapter $(KEYS_FLOOR32) --heads 19:1 --out docs/results/head_ranks_floor32.json
	set -e; for v in $(HEADS11); do n=$${v%%:*}; h=$${v#*:}; \
	  if [ $${n#*_} = 2k ]; then L="$(LE_FLOOR_2K)"; s=; else L="$(LE_FLOOR_8K)"; s=_8k; fi; \
	  $(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) --dense-heads $$h --budget 0.03 $$L \
	    --out $(RUNS)/heads11/$$n > $(RUNS)/heads11/$$n.log 2>&1; \
	  cp $(RUNS)/heads11/$$n/long_eval.json docs/results/long_eval_keys256_floor32_$${n%_*}_b03$$s.json; done
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_FLOOR32) --dense-heads $(H19_HEADS) --budget 0.03 $(LE_CODE_2K) \
		$(NO_BASE) --out $(RUNS)/heads11/h19_code_2k > $(RUNS)/heads11/h19_code_2k.log 2>&1
	cp $(RUNS)/heads11/h19_code_2k/long_eval.json docs/results/register_eval_keys256_floor32_h19_b03_code.json
	$(MAKE) results

# floor32 with the eleventh dense head the copy-loss search finds on training text (19:1; make floor32-heads) at a 3%
# share, shipped by name (issue 22; DECISIONS, "The copy head, found away from the probe"): 8192 with the oracle, then
# Python source at 8192 and the three baselines at 8192 (~90 min more), beside 2048/4096 and Python source at 2048
# with the oracle and the three baselines at 2048 (~70 min on 2 cores); then its speed beside floor32's in one quiet
# session and both cards (bench-floor32-copy, ~8 min alone).
KEYS_COPY := smollm2-135m-focus-keys256-floor32-copy
COPY_RUN ?= $(RUNS)/copy
COPY_SHIP := $(VENV)/bin/focusattn ship-adapter $(KEYS_FLOOR32) --name $(KEYS_COPY) --budget 0.03 \
	--dense-heads $(H19_HEADS)
ship-floor32-copy: $(STAMP)
	mkdir -p $(COPY_RUN)
	$(COPY_SHIP)
	( $(VENV)/bin/focusattn long-eval --adapter $(KEYS_COPY) $(LE_SHIP_8K) $(WITH_ORACLE) \
		--out $(COPY_RUN)/le_8k > $(COPY_RUN)/le_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_COPY) $(LE_CODE_8K) $(NO_BASE) \
		--out $(COPY_RUN)/le_code_8k > $(COPY_RUN)/le_code_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_COPY) $(LE_SHIP_8K) --baselines kmeans --variants kmeans@top1 \
		--out $(COPY_RUN)/le_base_8k > $(COPY_RUN)/le_base_8k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_COPY) $(LE_SHIP_8K) --baselines sliding,random \
		--variants sliding@top1,random@top1 --out $(COPY_RUN)/le_base_sr_8k \
		> $(COPY_RUN)/le_base_sr_8k.log 2>&1 ) & \
	( $(VENV)/bin/focusattn long-eval --adapter $(KEYS_COPY) $(LE_SHIP_2K) $(WITH_ORACLE) \
		--out $(COPY_RUN)/le_2k > $(COPY_RUN)/le_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_COPY) $(LE_CODE_2K) $(WITH_ORACLE) \
		--out $(COPY_RUN)/le_code_2k > $(COPY_RUN)/le_code_2k.log 2>&1 && \
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_COPY) $(LE_SHIP_2K) $(FLOOR_BASE) \
		--out $(COPY_RUN)/le_base_2k > $(COPY_RUN)/le_base_2k.log 2>&1 ) & wait
	cp $(COPY_RUN)/le_8k/long_eval.json docs/results/long_eval_keys256_floor32_copy_8k.json
	cp $(COPY_RUN)/le_2k/long_eval.json docs/results/long_eval_keys256_floor32_copy.json
	cp $(COPY_RUN)/le_base_2k/long_eval.json docs/results/long_eval_keys256_floor32_copy_baselines.json
	cp $(COPY_RUN)/le_code_2k/long_eval.json docs/results/register_eval_keys256_floor32_copy_code.json
	cp $(COPY_RUN)/le_code_8k/long_eval.json docs/results/register_eval_keys256_floor32_copy_code_8k.json
	cp $(COPY_RUN)/le_base_8k/long_eval.json docs/results/long_eval_keys256_floor32_copy_8k_baselines.json
	cp $(COPY_RUN)/le_base_sr_8k/long_eval.json docs/results/long_eval_keys256_floor32_copy_8k_baselines_sr.json
	$(MAKE) bench-floor32-copy

# The copy adapter and floor32 benched in one quiet session (the last step of ship-floor32-copy, or alone after a
# code change that moves their speed or memory: `make bench-floor32-copy DAY=1206e` after the cache kept key groups
# as bool, DECISIONS), their cards refreshed from the committed long-evals (~8 min alone).
bench-floor32-copy: $(STAMP)
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_COPY) --top-k 1 $(BM_8K) --out $(RUNS)/ship$(DAY)/keys256_copy
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_FLOOR32) --top-k 1 $(BM_8K) \
		--out $(RUNS)/ship$(DAY)/keys256_floor32
	for x in json png; do cp $(RUNS)/ship$(DAY)/keys256_copy/model_bench.$$x \
		docs/results/model_bench_keys256_floor32_copy_amx_$(DAY).$$x; \
		cp $(RUNS)/ship$(DAY)/keys256_floor32/model_bench.$$x docs/results/model_bench_keys256_floor32_amx_$(DAY).$$x; done
	$(COPY_SHIP) --long-eval docs/results/long_eval_keys256_floor32_copy.json \
		docs/results/long_eval_keys256_floor32_copy_8k.json \
		--model-bench docs/results/model_bench_keys256_floor32_copy_amx_$(DAY).json
	$(VENV)/bin/focusattn ship-adapter $(KEYS_FLOOR) --name $(KEYS_FLOOR32) --union-block 32 \
		--long-eval docs/results/long_eval_keys256_floor32_ship.json docs/results/long_eval_keys256_floor32_ship_8k.json \
		--model-bench docs/results/model_bench_keys256_floor32_amx_$(DAY).json
	$(MAKE) results

# Finer or adaptive key groups (issue 22): what causal changes to the key-space router's groups or group scores keep
# of the distant attention (online k-means assignment, balanced groups, variance or Quest-bound scores, 512 and 1024
# fitted centroids), against per-sequence k-means and the oracle (scripts/key_groups_probe.py), then
# the quality of 1024 centroids on Python source at 2048 (~10 min) and their whole-model speed beside the shipped 256,
# alone and in turn (~55 min on 2 cores, the benches ~12 min alone).
KG_RUN ?= $(RUNS)/online
KG := OMP_NUM_THREADS=1 $(PY) scripts/key_groups_probe.py
KG_ALL := served,online1,online8,cap2,cap4,gauss0.03,gauss0.0625,gauss0.125,bound,kmeans16,kmeans32
KG_BENCH := --lengths 8192 --top-k 1 --repeats 2 --decode-tokens 8 --threads 1
key-groups: $(STAMP) python-docs
	mkdir -p $(KG_RUN)/kg
	$(VENV)/bin/focusattn fit-keys --groups 512 $(KEYS_FIT) --budget 0.12 --out $(KG_RUN)/k512
	$(VENV)/bin/focusattn fit-keys --groups 1024 $(KEYS_FIT) --budget 0.12 --out $(KG_RUN)/k1024
	{ $(KG) --length 2048 --variants $(KG_ALL) --out $(KG_RUN)/kg/key_groups_k256_2k.json && \
	  $(KG) --adapter $(KG_RUN)/k512/adapter --length 2048 --variants served,kmeans16 \
		--out $(KG_RUN)/kg/key_groups_k512_2k.json && \
	  $(KG) --adapter $(KG_RUN)/k1024/adapter --length 2048 --variants served,kmeans16 \
		--out $(KG_RUN)/kg/key_groups_k1024_2k.json && \
	  $(KG) --length 8192 --variants served,kmeans16 --out $(KG_RUN)/kg/key_groups_k256_8k.json; } & \
	$(KG) --adapter $(KG_RUN)/k1024/adapter --length 8192 --variants served,kmeans16 \
		--out $(KG_RUN)/kg/key_groups_k1024_8k.json & wait
	$(VENV)/bin/focusattn long-eval --adapter $(KG_RUN)/k1024/adapter --key-scores means --lengths 2048 \
		--ppl-max-len 2048 --ppl-windows 2 --recall-windows 0 --passkey-per-depth 2 --repeat-n 2 --no-soft --top-k 1 \
		--threads 1 --data shakespeare --ood-data python-code --baselines '' --variants original,top1 \
		--out $(KG_RUN)/le/k1024_code_2k > $(KG_RUN)/k1024_code_2k.log 2>&1
	$(VENV)/bin/focusattn bench-model --adapter $(KG_RUN)/k1024/adapter --key-scores means $(KG_BENCH) --out $(KG_RUN)/bm_k1024
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_MEANS) $(KG_BENCH) --out $(KG_RUN)/bm_k256
	cp $(KG_RUN)/kg/key_groups_k*.json docs/results/
	cp $(KG_RUN)/le/k1024_code_2k/long_eval.json docs/results/register_eval_k1024_means_code.json
	cp $(KG_RUN)/bm_k1024/model_bench.json docs/results/key_groups_bench_k1024.json
	cp $(KG_RUN)/bm_k256/model_bench.json docs/results/key_groups_bench_k256.json
	$(MAKE) results

# Does routing by the layer's own keys need g2's dense heads? The shipped keys256 served with none (every head
# routed) at 8192 against the window and the oracle at the budget it then keeps (~65 min on one core), then the
# shipped one's whole-model speed re-measured after fill_budget ranked empty clusters last (alone, ~10 min).
keys-nodense: $(STAMP)
	mkdir -p $(KEYS_RUN) $(SHIP_RUN)
	$(VENV)/bin/focusattn long-eval --adapter $(KEYS_SHIP) --dense-heads none $(LE_8K_BASE) --baselines sliding,oracle \
		--out $(KEYS_RUN)/le256_nodense_8k > $(KEYS_RUN)/le256_nodense_8k.log 2>&1
	$(VENV)/bin/focusattn bench-model --adapter $(KEYS_SHIP) $(BM_KEYS) --out $(SHIP_RUN)/bm_keys256_2
	cp $(KEYS_RUN)/le256_nodense_8k/long_eval.json docs/results/long_eval_keys256_nodense_8k.json
	cp $(SHIP_RUN)/bm_keys256_2/model_bench.json docs/results/model_bench_keys256_ship.json
	cp $(SHIP_RUN)/bm_keys256_2/model_bench.png docs/results/model_bench_keys256_ship.png
	$(VENV)/bin/focusattn ship-adapter $(KEYS_SHIP) --refresh-card \
		--long-eval docs/results/long_eval_keys256_ship.json docs/results/long_eval_keys256L_b12_8k.json \
		docs/results/long_eval_keys256_ship_random.json docs/results/long_eval_keys256_ship_8k_random.json \
		--model-bench docs/results/model_bench_keys256_ship.json
	$(MAKE) results

# Can a router learn the partitions fitted on each window with hindsight (scripts/partition_oracle.py)? A linear and
# an MLP classifier of the layer input trained on the fitted groups of 40 cached target windows, served as routers
# on 9 others (~45 and ~25 min on one core each; needs the 49 windows `make routing-mlp` cached); the linear one
# saved as an adapter (g2i) and mixed with g2 by layer (g2is), both served on three registers and long-evaluated.
routing-imitation: $(STAMP)
	$(PY) scripts/partition_imitation.py --targets $(ROUTE)/targets --train 40 --eval 9 \
		--save-adapter $(ROUTE)/g2i/adapter --out docs/results/partition_imitation.json
	$(PY) scripts/partition_imitation.py --targets $(ROUTE)/targets --train 40 --eval 9 --hidden 64 --steps 400 \
		--layers 0,3,6,9,12,15,18,21,24,27 --out docs/results/partition_imitation_mlp.json
	$(PY) scripts/select_layers.py --base smollm2-135m-focus-g2 --donor $(ROUTE)/g2i/adapter \
		--measure docs/results/partition_imitation.json --out $(ROUTE)/g2is/adapter
	$(PY) scripts/router_recall.py --adapters smollm2-135m-focus-g2 $(ROUTE)/g2s48/adapter $(ROUTE)/g2i/adapter \
		$(ROUTE)/g2is/adapter --names g2 g2s48 g2i g2is --corpora shakespeare lee-news python-code --windows 2 \
		--out docs/results/router_recall_imitation.json
	$(VENV)/bin/focusattn long-eval --adapter $(ROUTE)/g2i/adapter $(LE_FLAGS) --top-k 1 --baselines oracle \
		--variants original,top1,oracle@top1 --out $(ROUTE)/le_g2i_2k
	cp $(ROUTE)/le_g2i_2k/long_eval.json docs/results/long_eval_attention_g2i.json
	$(VENV)/bin/focusattn long-eval --adapter $(ROUTE)/g2i/adapter --lengths 4096 8192 --ppl-max-len 8192 \
		--ppl-windows 1 --recall-windows 1 --passkey-per-depth 1 --repeat-n 1 --no-soft --top-k 1 --baselines oracle \
		--variants original,top1 --threads 1 --out $(ROUTE)/le_g2i_long
	cp $(ROUTE)/le_g2i_long/long_eval.json docs/results/long_eval_attention_g2i_long.json
	$(MAKE) imitation-curve

# Does the imitator learn more from more windows? Linear and MLP imitators trained on the first 10 / 20 / 40 cached
# windows, measured on the same 9 held-out ones (windows 40-48) in five layers (~35 min on one core); then on those
# 40 plus 120 more windows cached by scripts/cache_targets.py (~25 min; ~25 min per imitator); then the linear one
# given the previous token's layer input too (--context 1; ~10 and ~40 min).
imitation-curve: $(STAMP)
	for n in 10 20 40; do for h in 0 64; do \
		$(PY) scripts/partition_imitation.py --targets $(ROUTE)/targets --train $$n --eval 9 --eval-from 40 \
			--hidden $$h --steps $$([ $$h = 0 ] && echo 600 || echo 400) --layers 3,9,15,21,27 \
			--out docs/results/imitation_curve/$$([ $$h = 0 ] && echo linear || echo mlp)_$$n.json || exit 1; \
	done; done
	$(PY) scripts/cache_targets.py --samples 24:144 --exclude $(ROUTE)/targets --exclude-from 40 \
		--out $(ROUTE)/targets_more
	for h in 0 64; do \
		$(PY) scripts/partition_imitation.py --targets $(ROUTE)/targets --train 40 --eval 9 --eval-from 40 \
			--extra-train $(ROUTE)/targets_more --hidden $$h --steps $$([ $$h = 0 ] && echo 600 || echo 400) \
			--layers 3,9,15,21,27 \
			--out docs/results/imitation_curve/$$([ $$h = 0 ] && echo linear || echo mlp)_more.json || exit 1; \
	done
	$(PY) scripts/partition_imitation.py --targets $(ROUTE)/targets --train 40 --eval 9 --eval-from 40 --context 1 \
		--steps 600 --layers 3,9,15,21,27 --out docs/results/imitation_curve/linear_ctx1_40.json
	$(PY) scripts/partition_imitation.py --targets $(ROUTE)/targets --train 40 --eval 9 --eval-from 40 --context 1 \
		--extra-train $(ROUTE)/targets_more --steps 600 --layers 3,9,15,21,27 \
		--out docs/results/imitation_curve/linear_ctx1_more.json
	$(MAKE) results
