import json

import pytest

from focusattn.analysis.results import write_results
from focusattn.cli import main


def _summary(gate="log"):
    return {
        "command": "focusattn retrofit --out x",
        "config": {"model": "m", "data": "shakespeare", "ood_data": "lee-news", "steps": 3, "batch_size": 1,
                   "grad_accum": 1, "seq_len": 64,
                   "focus": {"num_groups": 2, "group_dim": 4, "window": 8, "gate": gate, "lam": 10.0,
                             "gate_offset": 0.5, "routing": "causal"}},
        "parameters": {"router": 10, "total": 1000, "percent": 1.0},
        "perplexity": {"before": {"domain": 30.0, "ood": 40.0},
                       "after": {"domain": {"soft": 29.5, "top1": 35.25, "top2": 30.0},
                                 "ood": {"soft": 41.0, "top1": 50.0, "top2": 40.0}}},
        "groups": [{"layer": 0, "dominance": 0.6, "confidence": 0.9, "group_share": [0.6, 0.4]}],
        "adapter": "x/adapter", "wall_seconds": 60.0,
    }


def test_results_are_generated_from_json(tmp_path):
    (tmp_path / "retrofit_default.json").write_text(json.dumps(_summary()))
    (tmp_path / "retrofit_mult.json").write_text(json.dumps(_summary("multiplicative")))
    out = write_results(tmp_path, tmp_path / "RESULTS.md")
    text = out.read_text()
    assert "35.25" in text and "focusattn retrofit --out x" in text and "multiplicative" in text
    assert "Not yet measured" in text  # bench/lab sections without JSON say so instead of inventing numbers


def test_report_cli_errors(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path / "missing"), "--out", str(tmp_path / "R.md")]) == 2
    assert "no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["nonsense-command"])


def test_gpu_bench_section_renders_measured_rows(tmp_path):
    """The GPU run's JSON (scripts/gpu_bench.py) becomes a table with the speed-up computed from its medians."""
    row = {"T": 32768, "dtype": "bfloat16", "routing": "random", "K": 8, "top_k": 1, "window": 128,
           "forward_s": {"sdpa": 0.003, "decomposed": 0.002, "decomposed_per_part": 0.01, "part_a_only": 0.0015},
           "memory_ratio_vs_sdpa": {"decomposed": 11.0}, "theoretical_ratio": 7.5,
           "forward_backward_ratio_vs_sdpa": 0.9}
    doc = {"schema": "focusattn.gpu_bench/1", "device": "GPU X", "torch": "2.x", "command": "scripts/gpu_check.sh",
           "mem_efficient_engine": {"ok": True, "reason": "ok"}, "flash_varlen_engine": {"ok": True, "reason": "ok"},
           "complete": False, "results": [row]}
    (tmp_path / "gpu_bench.json").write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "GPU X" in text and "**1.50x**" in text and "0.90x" in text and "stopped before" in text
    assert "flex-sorted" not in text  # not measured in that run: no table for it
    row["forward_s"]["flex_sorted"] = 0.001
    row["memory_ratio_vs_sdpa"]["flex_sorted"] = 2.5
    (tmp_path / "gpu_bench.json").write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "| 32768 | 1 | 3.00 | 2.00 | 1.00 | **3.00x** |  |  |  /  |  | 2.50x |" in text
    # the script's own section: both variants, their difference from the decomposed engine, and a failed row
    doc["flex_sorted"] = [{"T": 65536, "K": 8, "top_k": 1, "forward_s": {"sdpa": 0.01, "decomposed": 0.005,
                                                                          "flex_sorted": 0.004,
                                                                          "flex_sorted_whole_graph": 0.002},
                           "max_abs_diff_vs_decomposed": {"flex_sorted": 0.008, "flex_sorted_whole_graph": 0.9},
                           "peak_extra_bytes": {"sdpa": 10, "decomposed": 30, "flex_sorted": 20},
                           "forward_backward_ratio_vs_sdpa": 1.5},
                          {"T": 65536, "K": 8, "top_k": 2, "error": "OutOfMemoryError: x"}]
    (tmp_path / "gpu_bench.json").write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert ("| 65536 | 1 | 10.00 | 5.00 | 4.00 | **2.50x** | 2.00 | **5.00x** | 0.008 / 0.9 | 1.50x | 2.00x |"
            in text)
    assert "| 65536 | 2 | error: OutOfMemoryError: x |" in text
    doc["decode"] = [{"T": 65536, "K": 8, "top_k": 1, "dtype": "bfloat16", "step_s": {"sdpa": 0.002, "focus": 0.001},
                      "speedup_vs_sdpa": 2.0}]
    (tmp_path / "gpu_bench.json").write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "| 65536 | bfloat16 | 1 | 2.00 | 1.00 | **2.00x** |" in text


def test_gpu_model_bench_section_says_random_weights(tmp_path):
    """scripts/gpu_model_bench.py's JSON renders with its speed-ups and the weights labelled as random."""
    out = tmp_path / "gpu_model_bench.json"
    doc = {"schema": "focusattn.gpu_model_bench/1", "weights": "random (real shapes)", "device": "GPU X",
           "torch": "2.x", "dtype": "bfloat16", "backend": "auto", "focus": "K=8", "command": "python x", "results": [
               {"model": "llama-3.2-1b-shape", "T": 65536, "prefill_s": {"original": 2.0, "top1": 1.0, "top2": 1.6},
                "decode_ms": {"original": 9.0, "top1": 3.0, "top2": 4.5}, "prefill_speedup": {"top1": 2.0, "top2": 1.25},
                "decode_speedup": {"top1": 3.0, "top2": 2.0}, "peak_bytes": {"original": 2 ** 30, "top1": 2 ** 31,
                                                                              "top2": None}}]}
    out.write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "random (real shapes)" in text and "| llama-3.2-1b-shape | 65536 | 2.000 | 2.00x | 1.25x | 9.0 | 3.00x" in text
    assert "1.00 / 2.00 / " in text
    # several backends: a column per variant, named by top-k and backend
    doc["backends"] = ["auto", "flex-sorted"]
    r = doc["results"][0]
    r["prefill_s"]["top1@flex-sorted"], r["prefill_speedup"]["top1@flex-sorted"] = 0.5, 4.0
    r["decode_ms"]["top1@flex-sorted"], r["decode_speedup"]["top1@flex-sorted"] = 3.0, 3.0
    out.write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "top-1 flex-sorted ×" in text and "`auto`, `flex-sorted`" in text
    assert "| 2.000 | 2.00x | 1.25x | 4.00x | 9.0 | 3.00x | 2.00x | 3.00x |" in text


def test_pareto_changes_are_against_the_original_of_the_same_run():
    from focusattn.analysis.pareto import render_pareto

    def doc(adapter, orig, top1):
        return {"adapter": adapter, "focus_config": {"num_groups": 8}, "results": [
            {"T": 64, "variant": "original", "ppl_domain": orig, "ppl_ood": orig},
            {"T": 64, "variant": "top1", "ppl_domain": top1, "ppl_ood": top1, "budget_pairs_kept": 0.5}]}

    text = render_pareto([doc("runs/a/adapter", 10.0, 11.0), doc("runs/b/adapter", 20.0, 21.0)], [])
    assert "11.00 (+10.0%)" in text and "21.00 (+5.0%)" in text  # not 21 vs the first run's 10 (+110%)


def test_decision_table_leaves_out_rows_with_no_quality_at_its_length():
    """README's table reads one length: a configuration measured only at another length, or only timed, has nothing
    to say there and is left out, not shown as a row of dashes."""
    from focusattn.analysis.pareto import render_decision_table

    at64 = {"adapter": "runs/a/adapter", "focus_config": {"num_groups": 8}, "results": [
        {"T": 64, "variant": "original", "ppl_domain": 10.0, "ppl_ood": 10.0},
        {"T": 64, "variant": "top1", "ppl_domain": 11.0, "ppl_ood": 11.0, "budget_pairs_kept": 0.5},
        {"T": 64, "variant": "sliding@top1", "ppl_domain": 12.0, "ppl_ood": 12.0, "budget_pairs_kept": 0.5}]}
    at32 = {"adapter": "runs/a/adapter", "focus_config": {"num_groups": 8}, "results": [
        {"T": 32, "variant": "kmeans@top1", "ppl_domain": 13.0, "ppl_ood": 13.0, "budget_pairs_kept": 0.5}]}
    bench = {"adapter": "runs/a/adapter", "focus_config": {"num_groups": 8}, "results": [
        {"T": 64, "variant": v, "prefill_speedup": x, "decode_speedup": x} for v, x in
        (("original", 1.0), ("top1", 1.5), ("top2", 0.9))]}
    text = render_decision_table([at64, at32], [bench])
    assert "+10.0%" in text and "+20.0%" in text and "1.50×" in text
    assert "k-means" not in text and "top-2" not in text  # T=32 only; timed only
    # a baseline measured at this length whose configuration was not: left out with it, never shown under the
    # configuration above (seen: another adapter's random row under k8 top-2)
    other = {"adapter": "runs/b/adapter", "focus_config": {"num_groups": 8}, "results": [
        {"T": 64, "variant": "random@top1", "ppl_domain": 14.0, "ppl_ood": 14.0, "budget_pairs_kept": 0.4}]}
    text = render_decision_table([at64, at32, other], [bench])
    assert "+40.0%" not in text and "random" not in text


def test_decision_table_shows_shipped_names_as_loaded_not_their_served_variants():
    """README's rows are what loading a name gives; a run that served it with its own settings is an experiment."""
    from focusattn.analysis.pareto import render_decision_table

    def doc(cmd, ppl):
        return {"adapter": "smollm2-135m-focus-k8", "focus_config": {"num_groups": 8, "window": 512},
                "command": f"focusattn long-eval --adapter smollm2-135m-focus-k8 {cmd}", "results": [
                    {"T": 64, "variant": "original", "ppl_domain": 10.0, "ppl_ood": 10.0},
                    {"T": 64, "variant": "top1", "ppl_domain": ppl, "ppl_ood": ppl, "budget_pairs_kept": 0.5}]}

    text = render_decision_table([doc("", 11.0), doc("--window 512", 12.0)], [])
    assert "+10.0%" in text and "+20.0%" not in text and "+window" not in text


def test_decision_table_names_a_rows_own_original_where_its_passkeys_differ():
    """Runs hide different numbers of passkeys: a row is read against the original of its own run (or, for a
    baselines-only run, of its configuration's run), not the table's first original."""
    from focusattn.analysis.pareto import render_decision_table

    def doc(name, rows):
        return {"adapter": name, "focus_config": {"num_groups": 8}, "command": f"focusattn long-eval --adapter {name}",
                "results": rows}

    pk = lambda h, n: {"accuracy": h / n, "n": n}  # noqa: E731
    first = doc("runs/a/adapter", [{"T": 64, "variant": "original", "ppl_domain": 10.0, "passkey": pk(2, 3)},
                                   {"T": 64, "variant": "top1", "ppl_domain": 11.0, "passkey": pk(1, 3)}])
    second = doc("runs/b/adapter", [{"T": 64, "variant": "original", "ppl_domain": 10.0, "passkey": pk(2, 6)},
                                    {"T": 64, "variant": "top1", "ppl_domain": 11.0, "passkey": pk(2, 6)}])
    base_only = doc("runs/b/adapter", [{"T": 64, "variant": "sliding@top1", "ppl_domain": 12.0, "passkey": pk(1, 6)}])
    lines = render_decision_table([first, second, base_only], []).splitlines()
    row = lambda prefix: next(x for x in lines if x.startswith(prefix))  # noqa: E731
    assert "| 2/3 |" in row("| original") and "| 1/3 |" in row("| **runs/a**")
    assert "2/6 (original 2/6)" in row("| **runs/b**")
    assert "1/6 (original 2/6)" in row("| ↳ sliding")


def test_pareto_names_the_serving_settings_a_command_added():
    from focusattn.analysis.pareto import _adapter_name

    cfg = {"rebalance": 256, "rebalance_warm": True, "capacity": 1.5, "dense_heads": [[1, 0], [2, 1]]}
    doc = {"adapter": "runs/g2/adapter", "focus_config": cfg,
           "command": "focusattn long-eval --adapter runs/g2/adapter --rebalance-warm --capacity 1.5 --dense-heads x"}
    assert _adapter_name(doc) == "runs/g2 +warm +cap 1.5 +2 dense heads"
    assert _adapter_name({**doc, "command": "focusattn long-eval --adapter runs/g2/adapter"}) == "runs/g2"
    wide = {**doc, "focus_config": {**cfg, "window": 512},
            "command": "focusattn long-eval --adapter runs/g2/adapter --window 512"}
    assert _adapter_name(wide) == "runs/g2 +window 512"
    bare = {**wide, "focus_config": {**wide["focus_config"], "dense_heads": []},
            "command": wide["command"] + " --dense-heads none"}
    assert _adapter_name(bare) == "runs/g2 +window 512 +0 dense heads"  # never merged with the adapter's own rows
    lean = {"adapter": "runs/keys/k64L/adapter", "focus_config": {"budget": 0.12},
            "command": "focusattn long-eval --adapter runs/keys/k64L/adapter --budget 0.12"}
    assert _adapter_name(lean) == "runs/keys/k64L +budget 0.12"
    means = {"adapter": "smollm2-135m-focus-keys256", "focus_config": {"key_scores": "means"},
             "command": "focusattn long-eval --adapter smollm2-135m-focus-keys256 --key-scores means"}
    assert _adapter_name(means) == "smollm2-135m-focus-keys256 +means"
    own = [[7, 2], [8, 0], [14, 1], [15, 2], [17, 1], [18, 2], [20, 2], [23, 0], [23, 2], [24, 1]]
    floor = "smollm2-135m-focus-keys256-floor32"
    swap = {"adapter": floor, "focus_config": {"dense_heads": own[1:] + [[19, 1]]},
            "command": f"focusattn long-eval --adapter {floor} --dense-heads x"}
    assert _adapter_name(swap) == f"{floor} +10 dense heads (+19:1 -7:2)"  # not the row of another ten
    same = {**swap, "focus_config": {"dense_heads": own}}
    assert _adapter_name(same) == f"{floor} +10 dense heads"
    assert _adapter_name({**means, "command": "focusattn long-eval --adapter x --key-scores centroids",
                          "focus_config": {"key_scores": "centroids"}}) == "smollm2-135m-focus-keys256"
    union = {"adapter": "smollm2-135m-focus-keys256-means", "focus_config": {"budget": 0.03, "union_block": 64},
             "command": "focusattn long-eval --adapter smollm2-135m-focus-keys256-means --budget 0.03 --union-block 64"}
    assert _adapter_name(union) == "smollm2-135m-focus-keys256-means +budget 0.03 +union 64"
    floor = {"adapter": "smollm2-135m-focus-keys256-union", "focus_config": {"budget": 0.04, "union_block": 64,
                                                                             "min_keys": 128},
             "command": "focusattn long-eval --adapter smollm2-135m-focus-keys256-union --min-keys 128"}
    assert _adapter_name(floor) == "smollm2-135m-focus-keys256-union +min 128"


def test_dense_heads_section_renders_the_sweep(tmp_path):
    q = lambda p, r, k: {"ppl_a": p, "ppl_b": p + 1, "repeat_ppl": r, "passkey": k}  # noqa: E731
    doc = {"command": "python scripts/dense_heads_sweep.py --out x", "adapter": "runs/a/adapter", "T": 2048,
           "corpora": ["a", "b"], "filler": "b", "original": q(10.0, 1.5, 1.0),
           "rows": [{"heads": 6, "pairs_kept": 0.3, "top1": q(10.5, 3.0, 0.33),
                     "duo": {"window": 500, **q(11.0, 2.0, 0.67)}}]}
    (tmp_path / "dense_heads_sweep.json").write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "### Dense heads: how many" in text and "duo (window 500)" in text and "dense_heads_sweep.py --out x" in text
    assert "| 6 | 30.0% | top-1 | 10.50 (+5.0%) | 11.50 (+4.5%) | 3.00 | 0.33 |" in text


def test_dense_heads_section_renders_the_duplicate_sweep_by_spec(tmp_path):
    q = lambda p, r, k: {"ppl_a": p, "repeat_ppl": r, "passkey": k}  # noqa: E731
    doc = {"command": "python scripts/dense_heads_sweep.py --specs x --out y", "adapter": "runs/a/adapter",
           "T": 2048, "corpora": ["a"], "filler": "a", "original": q(10.0, 1.5, 1.0),
           "rows": [{"spec": "induction:6", "heads": 6, "pairs_kept": 0.3, "top1": q(10.5, 3.0, 0.33),
                     "duo": {"window": 500, **q(11.0, 2.0, 0.67)}},
                    {"spec": "induction:6+duplicate:4", "heads": 10, "pairs_kept": 0.33, "top1": q(10.2, 1.6, 0.33),
                     "duo": {"window": 490, **q(10.9, 1.9, 0.67)}}]}
    (tmp_path / "dense_heads_duplicate_sweep.json").write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "### Dense heads: duplicate-token heads beside induction heads" in text
    assert "duplicate-token score" in text and "--specs x --out y" in text
    assert "| induction:6+duplicate:4 (10) | 33.0% | top-1 | 10.20 (+2.0%) | 1.60 | 0.33 |" in text


def test_capacity_section_renders_the_sweep(tmp_path):
    q = lambda p, r, k: {"ppl_a": p, "ppl_b": p + 1, "repeat_ppl": r, "passkey": k}  # noqa: E731
    doc = {"command": "python scripts/capacity_sweep.py --out x", "adapter": "g2", "T": 2048, "long": 8192,
           "corpora": ["a", "b"], "filler": "b", "focus_config": {"dense_heads": [[1, 0]]},
           "original": q(10.0, 1.5, 1.0),
           "rows": [{"capacity": 0.0, "pairs_kept": 0.4, "pairs_kept_long": 0.3, "largest_group": {"a": 0.6, "b": 0.5},
                     "top1": q(10.2, 1.6, 1.0), "duo": {"window": 600, **q(10.5, 2.0, 0.0)}},
                    {"capacity": 1.5, "pairs_kept": 0.35, "pairs_kept_long": 0.27,
                     "largest_group": {"a": 0.21, "b": 0.2}, "top1": q(10.3, 1.7, 0.67),
                     "duo": {"window": 500, **q(10.6, 2.1, 0.0)}}]}
    (tmp_path / "capacity_sweep.json").write_text(json.dumps(doc))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "### Group-size cap (`FocusConfig.capacity`)" in text and "capacity_sweep.py --out x" in text
    assert "| 1.5 | 35.0% | 27.0% | 0.21 / 0.20 | top-1 | 10.30 (+3.0%) | 11.30 (+2.7%) | 1.70 | 0.67 |" in text
    assert "| off | 40.0% | 30.0% | 0.60 / 0.50 | top-1 |" in text


def test_a_longer_runs_curves_render_from_its_metrics_beside_it(tmp_path):
    s = {**_summary(), "heldout_start": {"step": 0, "heldout_top1": 36.0, "heldout_kept_top1": 0.5}}
    (tmp_path / "retrofit_long_x.json").write_text(json.dumps(s))
    recs = [{"step": i, "kept_top1": 0.5, "largest_share": [0.5, 0.5]} for i in (1, 2)]
    recs[1].update(heldout_top1=35.0, heldout_kept_top1=0.55)
    (tmp_path / "retrofit_long_x.metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "### Longer sequences: `long_x`" in text and "| 0 | 50.0% |" in text and "| 2 | 55.0% | — | 50.0% |" in text
    assert (tmp_path / "retrofit_long_x.curves.png").exists() and "results/retrofit_long_x.curves.png" in text


def test_kmeans_rows_of_the_older_rule_are_renamed_and_leave_the_decision_table():
    """long_eval.json written before the k-means baseline kept the router's budget (a fixed share of 8 clusters,
    a tenth of its keys) must not stand in README's table as "k-means keys, same budget"."""
    from focusattn.analysis.pareto import render_decision_table
    from focusattn.eval.longctx import KMEANS_RULE, budget_matched

    rows = [{"T": 64, "variant": "original", "ppl_domain": 10.0, "ppl_ood": 10.0},
            {"T": 64, "variant": "top1", "ppl_domain": 11.0, "ppl_ood": 11.0, "budget_pairs_kept": 0.5},
            {"T": 64, "variant": "kmeans@top1", "ppl_domain": 15.0, "ppl_ood": 15.0, "budget_pairs_kept": 0.5}]
    lay = {"masks": {"top1": {"dropped_distant": 0.3}, "kmeans@top1": {"dropped_distant": 0.7}}}
    old = {"adapter": "runs/a/adapter", "focus_config": {"num_groups": 8}, "results": rows,
           "recall": [{"T": 64, "split": "domain", "overall": lay, "layers": [lay]}]}
    renamed = budget_matched(old)
    assert [r["variant"] for r in renamed["results"]] == ["original", "top1", "kmeans-share@top1"]
    assert set(renamed["recall"][0]["overall"]["masks"]) == {"top1", "kmeans-share@top1"}
    assert set(renamed["recall"][0]["layers"][0]["masks"]) == {"top1", "kmeans-share@top1"}
    assert old["results"][2]["variant"] == "kmeans@top1"  # the loaded document itself is left alone
    assert "k-means" not in render_decision_table([renamed], [])
    new = {**old, "kmeans_rule": KMEANS_RULE}
    assert budget_matched(new) is new and "k-means keys" in render_decision_table([new], [])


def test_random_rows_of_a_union_key_space_run_before_the_rule_are_renamed():
    """A key-space adapter with a block union, long-evaluated before its random baseline kept the router's count
    per query: that random routing kept most distant keys, so its rows are ``random-union`` and leave README's
    table; without a union, or in a run with the rule, they stay ``random``."""
    from focusattn.analysis.pareto import render_decision_table, render_pareto
    from focusattn.eval.longctx import KMEANS_RULE, RANDOM_RULE, budget_matched

    rows = [{"T": 64, "variant": "original", "ppl_domain": 10.0, "ppl_ood": 10.0},
            {"T": 64, "variant": "top1", "ppl_domain": 11.0, "ppl_ood": 11.0, "budget_pairs_kept": 0.5},
            {"T": 64, "variant": "random@top1", "ppl_domain": 10.1, "ppl_ood": 10.1, "budget_pairs_kept": 0.5}]
    cfg = {"num_groups": 8, "router_input": "keys", "union_block": 64}
    old = {"adapter": "runs/a/adapter", "focus_config": cfg, "results": rows, "kmeans_rule": KMEANS_RULE}
    renamed = budget_matched(old)
    assert [r["variant"] for r in renamed["results"]] == ["original", "top1", "random-union@top1"]
    assert "random groups" not in render_decision_table([renamed], [])
    assert "`random-union` rows" in render_pareto([renamed], [])
    for doc in ({**old, "random_rule": RANDOM_RULE}, {**old, "focus_config": {**cfg, "union_block": 0}}):
        assert budget_matched(doc) is doc and "random groups" in render_decision_table([doc], [])


def test_key_clusters_section_renders_drop_keys_and_perplexity():
    from focusattn.analysis.recall_report import render_key_clusters

    def row(c, m, d, k, p):
        return {"corpus": c, "mask": m, "dropped_distant": d, "keys_per_query": k, "ppl": p}

    doc = {"command": "python scripts/key_clusters_probe.py --out x", "adapter": "g2", "length": 64, "windows": 1,
           "fit": {"corpora": ["shakespeare"], "windows": 2, "seconds": 3.0},
           "rows": [row("a", "top1", 0.35, 140, 11.0), row("a", "fitted64", 0.25, 150, 10.5),
                    {"corpus": "a", "mask": "original", "ppl": 10.0}]}
    text = render_key_clusters(doc)
    assert "| top1 | 35.0% (140); +10.0% |" in text and "| fitted64 | 25.0% (150); +5.0% |" in text
    assert "| original perplexity | 10.00 |" in text


def test_a_run_without_the_original_is_compared_with_every_runs_original():
    """A baselines-only run (no `original` variant) reads the original's perplexity at its length from whichever
    run measured it, even when an earlier run's original row at that length had only the probes."""
    from focusattn.analysis.pareto import render_pareto

    def doc(adapter, rows):
        return {"adapter": adapter, "focus_config": {"num_groups": 8}, "results": rows}

    probes = {"repeat_ppl": 1.0, "passkey": {"accuracy": 1.0}}
    first = doc("runs/a/adapter", [{"T": 64, "variant": "original", **probes},
                                   {"T": 64, "variant": "top1", "budget_pairs_kept": 0.5, **probes}])
    second = doc("runs/a/adapter", [{"T": 64, "variant": "original", "ppl_domain": 10.0, "ppl_ood": 20.0, **probes},
                                    {"T": 64, "variant": "top1", "ppl_domain": 11.0, "ppl_ood": 21.0,
                                     "budget_pairs_kept": 0.5, **probes}])
    alone = doc("runs/a/adapter", [{"T": 64, "variant": "sliding@top1", "ppl_domain": 12.0, "ppl_ood": 22.0,
                                    "budget_pairs_kept": 0.5, **probes}])
    row = next(x for x in render_pareto([first, second, alone], []).splitlines() if "sliding@top1" in x)
    assert "12.00 (+20.0%)" in row and "22.00 (+10.0%)" in row
