"""Quick-mode kernel benchmark: schema, finiteness and that the markdown is generated from the JSON (not speed)."""
import json
import math

from focusattn.cli import main
from focusattn.bench.report import render_markdown


def test_quick_bench_via_cli_writes_json_plot_and_markdown(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--out", str(out), "--quick", "--lengths", "128", "--groups", "2", "4",
                 "--top-k", "1", "2", "--decode-len", "128", "--threads", "1"]) == 0

    doc = json.loads((out / "bench.json").read_text())
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporaries
    assert doc["schema"] == "focusattn.kernel_bench/1" and doc["config"]["quick"] is True
    assert doc["config"]["lengths"] == [128] and doc["config"]["groups"] == [2, 4]
    assert doc["env"]["threads"] == 1

    rows = doc["results"]
    assert all(r.get("error") is None for r in rows), [r["error"] for r in rows if r.get("error")]
    for t in (128,):
        backends = {(r["backend"], r["K"], r["top_k"]) for r in rows if r["T"] == t}
        expected = {("sdpa", None, None)} | {(b, kk, tk) for b in ("decomposed", "flex")
                                             for kk in (2, 4) for tk in (1, 2)}
        assert expected <= backends and any(b[0] == "dense" for b in backends)
    for r in rows:
        assert len(r["times_s"]) == doc["config"]["repeats"]
        assert math.isfinite(r["median_s"]) and r["median_s"] > 0
        assert math.isfinite(r["ratio_vs_sdpa"]) and r["ratio_vs_sdpa"] > 0
        if r["backend"] != "sdpa":
            assert math.isfinite(r["theoretical_ratio"]) and r["theoretical_ratio"] > 0
        if r["backend"] == "decomposed":  # the timed kernel computed the right thing
            assert r["diff_reference"] in ("dense", "flex") and r["max_abs_diff"] <= 1e-4
    # top-2 over 2 groups puts every token in both groups: the cost model must say "all pairs, no speedup"
    full = [r for r in rows if r["backend"] == "decomposed" and r["K"] == 2 and r["top_k"] == 2]
    assert all(r["theoretical_ratio"] <= 1.0 for r in full)

    dec = doc["decode"]
    assert dec["T"] == 128 and {r["backend"] for r in dec["results"]} == {"sdpa_cached", "focus_decode",
                                                                          "focus_decode_indexed"}
    assert all(math.isfinite(r["ratio_vs_sdpa"]) and r["keys_attended"] <= 128 for r in dec["results"])
    assert all(r["max_abs_diff_vs_scan"] <= 1e-5 for r in dec["results"] if r["backend"] == "focus_decode_indexed")

    md = render_markdown(doc)
    assert md in capsys.readouterr().out  # the CLI prints the section it renders from the JSON
    r = next(r for r in rows if r["backend"] == "decomposed" and r["T"] == 128 and r["K"] == 4 and r["top_k"] == 1)
    assert "| 128 | 4 | 1 |" in md and f"{r['ratio_vs_sdpa']:.2f}×" in md
    assert "bench.png" in md and doc["command"] in md


def test_render_markdown_reads_numbers_from_json():
    """Change a number in the JSON and the markdown follows (nothing is typed by hand)."""
    doc = {
        "config": {"heads": 9, "kv_heads": 3, "head_dim": 64, "batch": 1, "dtype": "float32", "window": 128,
                   "repeats": 3, "lengths": [32768], "groups": [8], "top_ks": [1], "flex_mode": "compiled"},
        "env": {"torch": "x", "threads": 1, "platform": "p", "time_utc": "t"},
        "command": "focusattn bench --out runs/bench",
        "cost_model": "cm", "memory_method": "mm",
        "results": [
            {"T": 32768, "backend": "sdpa", "K": None, "top_k": None, "median_s": 20.0, "ratio_vs_sdpa": 1.0,
             "peak_mem_bytes": 2**20},
            {"T": 32768, "backend": "decomposed", "K": 8, "top_k": 1, "median_s": 3.0, "ratio_vs_sdpa": 6.6667,
             "theoretical_ratio": 7.3, "peak_mem_bytes": 3 * 2**20},
        ],
        "targets": {"k8_top1_32k_speedup_vs_sdpa": 6.6667, "k8_top1_32k_at_least_5x": True},
    }
    md = render_markdown(doc)
    assert "| 32768 | 8 | 1 | 20000 | 3000 | 6.67× | 7.30× |" in md
    assert "yes (measured 6.67×)" in md and "`focusattn bench --out runs/bench`" in md
    doc["results"][1]["ratio_vs_sdpa"] = 4.0
    doc["targets"] = {"k8_top1_32k_speedup_vs_sdpa": 4.0, "k8_top1_32k_at_least_5x": False}
    md = render_markdown(doc)
    assert "| 4.00× |" in md and "**no** (measured 4.00×)" in md


def test_decode_only_merges_into_existing_json(tmp_path, capsys):
    """--decode-only replaces the decode section and keeps the prefill results (and shows both in the markdown)."""
    out = tmp_path / "bench"
    out.mkdir()
    prefill = {"schema": "focusattn.kernel_bench/1", "command": "focusattn bench --out x",
               "config": {"heads": 9, "kv_heads": 3, "head_dim": 64, "batch": 1, "dtype": "float32", "window": 128,
                          "repeats": 3, "lengths": [32768], "groups": [8], "top_ks": [1], "flex_mode": "compiled"},
               "env": {"torch": "x", "threads": 1, "platform": "p", "time_utc": "t"}, "cost_model": "cm",
               "memory_method": "mm",
               "results": [{"T": 32768, "backend": "sdpa", "K": None, "top_k": None, "median_s": 20.0,
                            "ratio_vs_sdpa": 1.0, "peak_mem_bytes": 2**20},
                           {"T": 32768, "backend": "decomposed", "K": 8, "top_k": 1, "median_s": 3.0,
                            "ratio_vs_sdpa": 6.6667, "theoretical_ratio": 7.3, "peak_mem_bytes": 3 * 2**20}],
               "decode": None}
    (out / "bench.json").write_text(json.dumps(prefill))
    assert main(["bench", "--out", str(out), "--decode-only", "--decode-len", "300", "--groups", "4",
                 "--top-k", "1", "2", "--decode-repeats", "2", "--threads", "1"]) == 0
    doc = json.loads((out / "bench.json").read_text())
    assert doc["results"] == prefill["results"] and doc["command"] == prefill["command"]
    assert doc["targets"]["k8_top1_32k_at_least_5x"] is True
    dec = doc["decode"]
    assert dec["T"] == 300 and len(dec["results"]) in (5, 10) and dec["command"].startswith("focusattn ")
    md = render_markdown(doc)
    assert md in capsys.readouterr().out
    assert "| 32768 | 8 | 1 | 20000 | 3000 | 6.67× |" in md
    r = next(r for r in dec["results"] if r["backend"] == "focus_decode_indexed" and r["top_k"] == 2)
    assert (f"| {r['malloc']} | focus_decode_indexed | 4 | 2 | {r['keys_attended']} | {r['median_s'] * 1e3:.2f} | "
             f"{r['ratio_vs_sdpa']:.2f}× | {r['cpu_median_s'] * 1e3:.2f} |") in md
    assert dec["command"] in md


def test_half_precision_bench_records_dtype_and_stays_close_to_dense(tmp_path):
    out = tmp_path / "bf16"
    assert main(["bench", "--out", str(out), "--quick", "--lengths", "128", "--groups", "4", "--top-k", "1",
                 "--decode-len", "0", "--no-flex", "--dtype", "bfloat16", "--threads", "1"]) == 0
    doc = json.loads((out / "bench.json").read_text())
    assert doc["config"]["dtype"] == "bfloat16"
    dec = [r for r in doc["results"] if r["backend"] == "decomposed"]
    # decomposed accumulates in float32; the dense reference runs in bfloat16 (8 mantissa bits): ~1e-2 apart
    assert dec and all(r["max_abs_diff"] <= 5e-2 for r in dec)
    assert "bfloat16" in render_markdown(doc)


def test_issue_targets_evaluated_from_the_json():
    """Speed targets need wall and CPU time both at the target; decode K >= 8 must win in every malloc regime."""
    from focusattn.bench.targets import evaluate_targets

    row = lambda t, kk, tk, r, cpu: {"T": t, "backend": "decomposed", "K": kk, "top_k": tk, "median_s": 1.0,  # noqa: E731
                                     "ratio_vs_sdpa": r, "cpu_ratio_vs_sdpa": cpu, "theoretical_ratio": 7.5}
    doc = {"results": [row(32768, 8, 1, 6.6, 6.7), row(32768, 8, 2, 1.7, 1.5), row(2048, 8, 1, 0.9, 0.9)],
           "decode": {"results": [
               {"backend": "focus_decode_indexed", "K": 8, "top_k": 1, "malloc": "heap", "ratio_vs_sdpa": 3.0,
                "cpu_ratio_vs_sdpa": 3.1},
               {"backend": "focus_decode_indexed", "K": 8, "top_k": 2, "malloc": "mmap", "ratio_vs_sdpa": 1.1,
                "cpu_ratio_vs_sdpa": 0.9},
               {"backend": "focus_decode_indexed", "K": 4, "top_k": 2, "malloc": "mmap", "ratio_vs_sdpa": 0.5,
                "cpu_ratio_vs_sdpa": 0.5}]}}
    tg = evaluate_targets(doc)
    met = {(s["K"], s["top_k"]): s["met"] for s in tg["speed_targets"]}
    assert met == {(8, 1): True, (8, 2): False}  # K=16 top-2 was not measured: not listed
    assert tg["decode_k8_plus_faster_everywhere"] is False
    assert [(d["malloc"], d["top_k"]) for d in tg["decode_not_faster"]] == [("mmap", 2)]  # K=4 is not in the target
    assert tg["k8_top1_2k_breaks_even"] is False and tg["k8_top1_2k_speedup_vs_sdpa"] == 0.9
