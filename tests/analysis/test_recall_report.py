"""The recall section of RESULTS renders from long-eval JSON (tables, ratios to the oracle, per-layer plot)."""
import numpy as np

import focusattn as fa
from focusattn.analysis.recall_report import recall_section, render_recall
from focusattn.eval.recall import measure_recall
from tests.conftest import tiny_model


def _doc():
    focus = fa.compose(tiny_model("llama"), fa.FocusConfig(num_groups=4, group_dim=8, window=3)).eval()
    rec = measure_recall(focus, np.random.default_rng(0).integers(0, 90, (1, 30)), top_ks=(1,), progress=False)
    return {"adapter": "runs/x/adapter", "focus_config": {"rebalance": 0}, "corpora": {"domain": "tiny"},
            "command": "focusattn long-eval --adapter runs/x/adapter --recall-windows 1",
            "recall": [{"T": 30, "split": "domain", **rec}]}


def test_recall_tables_and_plot(tmp_path):
    doc = _doc()
    text = recall_section([doc], tmp_path)
    assert "**runs/x**, T = 30, domain (tiny, 1 windows)" in text
    rows = [line for line in text.splitlines() if line.startswith("| top1 ") or line.startswith("| oracle@top1 ")]
    assert len(rows) == 2 and rows[0].split("|")[4].strip().endswith("×") and rows[1].split("|")[4].strip() == "—"
    assert (tmp_path / "recall_runs-x_30_domain.png").stat().st_size > 0
    assert "focusattn long-eval --adapter runs/x/adapter" in text
    assert "Not yet measured" in render_recall([{"adapter": "a", "results": []}])


def test_a_second_run_of_the_same_configuration_gets_its_own_plot(tmp_path):
    """A re-measured baseline (a second long_eval.json of the same adapter and length) never overwrites the first
    run's per-layer plot."""
    doc = _doc()
    text = recall_section([doc, doc], tmp_path)
    assert "results/recall_runs-x_30_domain.png" in text and "results/recall_runs-x_30_domain_2.png" in text
    assert (tmp_path / "recall_runs-x_30_domain_2.png").stat().st_size > 0


def test_global_keys_table():
    from focusattn.analysis.recall_report import render_global_keys

    doc = {"fractions": [0.01, 0.05], "T": 64, "window": 8, "sinks": 1, "command": "python scripts/x.py --out y",
           "corpora": {"a": {"distant_share": 0.25, "held": [0.5, 0.6]}}}
    text = render_global_keys(doc)
    assert "| a | 25% | 50% | 60% |" in text and "held by top 1% of keys" in text and "scripts/x.py" in text


def test_render_partition_oracle_lists_each_layer_and_the_mean():
    from focusattn.analysis.recall_report import render_partition_oracle

    r = {"global_share": 0.4, "router": 0.3, "router_budget": 0.2, "symmetric": 0.6, "symmetric_budget": 0.2,
         "asymmetric": 0.7, "asymmetric_budget": 0.3}
    doc = {"command": "python scripts/partition_oracle.py --out x", "windows": ["a", "b"], "groups": 8,
           "capacity": 1.5, "what": "mass kept", "mean": r, "layers": [{"layer": 0, **r}]}
    text = render_partition_oracle(doc)
    assert "| 0 | 40% | 30% (20%) | 60% (20%) | 70% (30%) |" in text and "| **mean** |" in text
    assert "scripts/partition_oracle.py" in text and "2 cached target windows" in text


def test_render_partition_imitation_lists_each_layer_held_out_and_training():
    from focusattn.analysis.recall_report import render_partition_imitation

    r = {}
    for split in ("train", "eval"):
        for i, n in enumerate(("router", "router_capped", "imitator", "imitator_served", "imitator_served_capped",
                               "fitted")):
            r[f"{split}_{n}"], r[f"{split}_{n}_budget"] = 0.1 * (i + 1), 0.2
        r[f"{split}_router_agreement"], r[f"{split}_imitator_agreement"] = 0.3, 0.5 if split == "train" else 0.25
    doc = {"command": "python scripts/partition_imitation.py --out x", "train_windows": ["a", "b"],
           "eval_windows": ["c"], "groups": 8, "capacity": 1.5, "hidden": 0, "what": "mass kept", "mean": r,
           "layers": [{"layer": 3, **r}]}
    text = render_partition_imitation(doc)
    assert "| 3 | 10% (20%) | 20% (20%) | 40% (20%) | 50% (20%) | 60% (20%) | 40% (20%) | 50% / 25% |" in text
    assert "| **mean** |" in text and "Imitator: linear; 2 training and 1 held-out" in text
    assert "an MLP of width 64" in render_partition_imitation({**doc, "hidden": 64})


def test_render_router_recall_has_a_row_per_mask_and_a_column_per_register():
    from focusattn.analysis.recall_report import render_router_recall

    rows = [{"corpus": c, "mask": m, "dropped_distant": d, "keys_per_query": k}
            for c in ("shakespeare", "lee-news") for m, d, k in (("g2", 0.345, 143.7), ("oracle@top1", 0.178, 143.7))]
    rows = rows[:-1]  # a cell not measured
    doc = {"command": "python scripts/router_recall.py --out x", "length": 2048, "windows": 2,
           "trained_on": "shakespeare", "adapters": {"g2": "smollm2-135m-focus-g2"}, "rows": rows}
    text = render_router_recall(doc)
    assert "| mask | shakespeare | lee-news |" in text and "| g2 | 34.5% (144) | 34.5% (144) |" in text
    assert "| oracle@top1 | 17.8% (144) | — |" in text and "scripts/router_recall.py" in text


def test_render_imitation_curve_has_a_row_per_run_linear_first_by_windows():
    from focusattn.analysis.recall_report import render_imitation_curve

    def doc(n, hidden, agree, context=0):
        m = {"train_imitator_agreement": 0.5, "eval_imitator_agreement": agree, "eval_imitator": 0.4,
             "eval_imitator_budget": 0.2, "eval_imitator_served_capped": 0.25,
             "eval_imitator_served_capped_budget": 0.14, "eval_router_capped": 0.19, "eval_fitted": 0.6}
        return {"command": f"python scripts/partition_imitation.py --train {n} --hidden {hidden}",
                "train_windows": ["w"] * n, "eval_windows": ["e"] * 9, "hidden": hidden, "mean": m,
                "layers": [{"layer": 3}, {"layer": 9}], "context": context}

    text = render_imitation_curve([doc(40, 0, 0.36, context=1), doc(40, 64, 0.35), doc(20, 0, 0.34),
                                   doc(10, 0, 0.29)])
    rows = [ln for ln in text.splitlines() if ln.startswith("| linear") or ln.startswith("| MLP")]
    assert [r.split(" | ")[:2] for r in rows] == [["| linear", "10"], ["| linear", "20"], ["| MLP 64", "40"],
                                                  ["| linear, + 1 previous token's input", "40"]]
    assert "50% / 29.0% | 40.0% (20%) | 25.0% (14%) | 19.0% | 60.0% |" in rows[0]
    assert "layers 3, 9" in text and text.count("- `python scripts/partition_imitation.py") == 4


def test_render_shared_ranking_has_a_row_per_ranking_and_the_union_per_split():
    from focusattn.analysis.recall_report import render_shared_ranking

    doc = {"command": "python scripts/shared_ranking_probe.py --out x.json", "adapter": "a", "T": 2048, "windows": 1,
           "splits": {s: {"own": {"dropped_distant": 0.3, "keys_per_query": 9, "union_over_kept": 2.9},
                          "prev": {"dropped_distant": 0.34 + d, "keys_per_query": 9, "union_over_kept": 1.2},
                          "oracle@own": {"dropped_distant": 0.2, "keys_per_query": 9}}
                      for s, d in (("domain", 0.0), ("ood", 0.01))}}
    text = render_shared_ranking(doc)
    assert "| own | 30.0% | 2.90x | 30.0% | 2.90x |" in text
    assert "| prev | 34.0% | 1.20x | 35.0% | 1.20x |" in text
    assert "| oracle@own | 20.0% | — | 20.0% | — |" in text


def test_render_block_union_puts_the_oracle_kept_and_computed_keys_in_each_cell():
    from focusattn.analysis.recall_report import render_block_union

    cell = lambda d, k, c=None: {"dropped_distant": d, "keys_per_query": k,  # noqa: E731
                                 **({} if c is None else {"computed_per_query": c})}
    doc = {"command": "python scripts/block_union_probe.py --out x.json", "adapter": "a", "served_budget": 0.12,
           "T": 2048, "windows": 1, "block": 64,
           "splits": {"shakespeare": {"own@0.03": cell(0.436, 25, 130), "pp@0.03": cell(0.316, 186, 201),
                                      "oracle@pp@0.03": cell(0.192, 186)}}}
    text = render_block_union(doc)
    assert "| own@0.03 | 43.6% · 25 · 130 |" in text
    assert "| pp@0.03 | 31.6% (19.2%) · 186 · 201 |" in text
    assert "oracle@" not in text.split("|---|")[1]


def test_render_floor_probe_puts_the_oracle_and_kept_keys_in_each_cell():
    from focusattn.analysis.recall_report import render_floor_probe

    row = lambda d, o, k: {"dropped_distant": d, "oracle_dropped_distant": o, "keys_per_query": k}  # noqa: E731
    doc = {"command": "python scripts/floor_probe.py --out x.json", "adapter": "a", "budget": 0.04, "union_block": 64,
           "T": 2048, "windows": 1,
           "splits": {"shakespeare": {"0": row(0.2865, 0.167, 229.3), "128": row(0.1296, 0.0636, 423)},
                      "lee-news": {"0": row(0.25, 0.15, 220)}}}
    text = render_floor_probe(doc)
    assert "| min_keys | shakespeare | lee-news |" in text
    assert "| 0 | 28.6% (16.7%) · 229 | 25.0% (15.0%) · 220 |" in text
    assert "| 128 | 13.0% (6.4%) · 423 | — |" in text


def test_render_registers_rows_changes_against_the_same_run_and_oracle_ratio(tmp_path):
    """A register outside the fit gets its own table (never the Pareto's news column): changes against the original
    of the same run, passkey counts, and the distant attention dropped over the oracle's."""
    from focusattn.analysis.recall_report import render_registers
    from focusattn.analysis.results import write_results

    def row(v, dom, ood, drop=None, pk=1.0):
        r = {"T": 2048, "variant": v, "ppl_domain": dom, "ppl_ood": ood, "repeat_ppl": 1.5,
             "passkey": {"accuracy": pk, "n": 6}}
        return r if drop is None else {**r, "budget_pairs_kept": 0.3, "distant_dropped": {"domain": drop[0],
                                                                                        "ood": drop[1]}}
    doc = {"adapter": "smollm2-135m-focus-keys256-means", "focus_config": {"key_scores": "means"},
           "corpora": {"domain": "shakespeare", "ood": "python-code"}, "command": "focusattn long-eval --x",
           "results": [row("original", 10.0, 8.0), row("top1", 10.2, 8.4, (0.3, 0.28), pk=4 / 6),
                       row("oracle@top1", 10.1, 8.1, (0.2, 0.14))]}
    text = render_registers([doc])
    top1 = next(line for line in text.splitlines() if "| top1 |" in line)
    assert "python-code" in top1 and "10.20 (+2.0%)" in top1 and "8.40 (+5.0%)" in top1
    assert "4/6" in top1 and "30.0% / 28.0%" in top1 and "1.50x / 2.00x" in top1
    oracle = next(line for line in text.splitlines() if "| oracle@top1 |" in line)
    assert oracle.endswith("| — |")  # the oracle over itself says nothing
    assert "`focusattn long-eval --x`" in text
    (tmp_path / "register_eval_code.json").write_text(__import__("json").dumps(doc))
    out = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "A register outside the routing's fit" in out and "8.40 (+5.0%)" in out


def test_render_key_groups_rows_oracle_ratio_and_the_benches_beside(tmp_path):
    """Key-group probes become one table (a row per centroid count, length and variant; dropped over the oracle's
    per register) and the bench runs kept beside them (never in the Pareto) a speed table."""
    import json

    from focusattn.analysis.recall_report import render_key_groups
    from focusattn.analysis.results import write_results

    def doc(k, t, served):
        split = {"served": {"dropped_distant": served, "keys_per_query": 100, "imbalance": 1.5,
                            "groups_per_query": 15.0},
                 "kmeans16": {"dropped_distant": 0.25, "keys_per_query": 100, "imbalance": 1.3,
                              "groups_per_query": 30.0},
                 "oracle@served": {"dropped_distant": 0.2, "keys_per_query": 100}}
        return {"command": f"python scripts/key_groups_probe.py --k {k}", "adapter": "a", "groups": k,
                "budget": 0.12, "T": t, "windows": 1, "splits": {"shakespeare": split, "python-code": split}}
    bench = {"adapter": "runs/k1024/adapter", "command": "focusattn bench-model --x", "cpu": "Xeon",
             "results": [{"T": 8192, "variant": "original", "prefill_speedup": 1.0, "decode_speedup": 1.0},
                         {"T": 8192, "variant": "top1", "prefill_speedup": 0.66, "decode_speedup": 0.93}]}
    text = render_key_groups([doc(1024, 2048, 0.28), doc(256, 2048, 0.3)], [bench])
    rows = [line for line in text.splitlines() if line.startswith("| 256 |") or line.startswith("| 1024 |")]
    assert rows[0].startswith("| 256 | 2048 | served | 30.0% (1.50x) | 30.0% (1.50x) | 15.0 | 1.50 |")
    assert rows[3].startswith("| 1024 | 2048 | served | 28.0% (1.40x)")
    assert "| oracle@served | 20.0% | 20.0% | — | — |" in text
    assert "| `runs/k1024/adapter` | 8192 | 0.66x | 0.93x | Xeon |" in text and "`focusattn bench-model --x`" in text
    (tmp_path / "key_groups_k256_2k.json").write_text(json.dumps(doc(256, 2048, 0.3)))
    (tmp_path / "key_groups_bench_k1024.json").write_text(json.dumps(bench))
    out = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "Finer or adaptive key groups" in out and "0.66x" in out and "Whole-model speed: `runs/k1024" not in out


def test_head_ranks_render_each_measures_rank_and_the_copy_loss_it_starts_from():
    from focusattn.analysis.recall_report import render_head_ranks

    doc = {"command": "python scripts/head_ranks.py --heads 19:1", "adapter": "a", "length": 2048,
           "corpora": ["shakespeare"], "dense_heads": ["7:2"],
           "measures": {"induction": {"top": [["22:2", 0.12], ["19:1", 0.05]], "rank": {"19:1": 2}, "routed_heads": 80},
                        "dense_gain": {"top": [["19:1", 0.046]], "rank": {"19:1": 1}, "routed_heads": 80}},
           "copy_loss": {"original": 0.44, "served": 0.49, "layer_gain": {"3": 0.001, "19": 0.04}}}
    text = render_head_ranks(doc)
    assert "| induction | 2 / 80 | 22:2 (0.120), 19:1 (0.050) |" in text and "| dense_gain | 1 / 80 |" in text
    assert "original 0.4400, served 0.4900" in text and "19 (0.0400), 3 (0.0010)" in text
    assert "`python scripts/head_ranks.py --heads 19:1`" in text
