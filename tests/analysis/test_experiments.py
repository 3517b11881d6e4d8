"""The experiment tables of issue 11 (collapse ablation, sweeps, Focus vs LoRA) generated from synthetic result files:
the numbers in RESULTS are the ones in the JSON, and bad input names what is missing and how to produce it."""
import json

import pytest

from focusattn.analysis.collapse import collect, first_collapse
from focusattn.analysis.results import write_results
from focusattn.analysis.sweeps import render_markdown as sweeps_markdown
from focusattn.analysis.sweeps import sweep_rows
from focusattn.cli import main


def summary(*, k=8, w=128, tau=0.1, dg=16, iters=10, routing="causal", steps=60, dom=(0.2, 0.3), ppl=30.0,
            method="focus", rank=None, pk=(0.3, 0.5)):
    s = {
        "command": f"focusattn retrofit --groups {k} --window {w}", "method": method,
        "config": {"model": "m", "data": "shakespeare", "ood_data": "lee-news", "steps": steps, "batch_size": 1,
                   "grad_accum": 1, "seq_len": 512, "seed": 0, "lora_rank": rank, "lora_alpha": None,
                   "focus": {"num_groups": k, "group_dim": dg, "window": w, "tau": tau, "sinkhorn_iters": iters,
                             "gate": "log", "lam": 10.0, "gate_offset": 0.5, "routing": routing, "sink_tokens": 1}},
        "parameters": {"router": 1000, "trainable": 1000, "total": 100000, "percent": 1.0},
        "perplexity": {"before": {"domain": 25.0, "ood": 35.0},
                       "after": {"domain": {"soft": ppl, "top1": ppl + 2, "top2": ppl + 1},
                                 "ood": {"soft": ppl + 10, "top1": ppl + 12, "top2": ppl + 11}}},
        "groups": [{"layer": i, "dominance": d, "confidence": 0.9} for i, d in enumerate(dom)],
        "pairs_kept": {"top1": pk[0], "top2": pk[1]}, "adapter": "x", "wall_seconds": 60.0,
    }
    if method == "lora":
        s["parameters"] = {"lora": 4000 * rank, "trainable": 4000 * rank, "total": 100000, "percent": 4.0 * rank}
        s["perplexity"]["after"] = {"domain": {"lora": ppl}, "ood": {"lora": ppl + 5}}
        s["groups"], s["pairs_kept"] = [], {}
    return s


def run_dir(tmp, name, shares, **kw):
    d = tmp / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary(**kw)))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "loss": 3.0, "largest_share": sh}) + "\n"
                                             for i, sh in enumerate(shares)))
    return d


def test_collapse_table_and_plot(tmp_path):
    # softmax: both layers climb to one group at step 4; Sinkhorn variants stay near 1/8
    soft = run_dir(tmp_path, "softmax", [[0.2, 0.3], [0.5, 0.6], [0.8, 0.9], [0.95, 1.0], [1.0, 1.0]], iters=0)
    seq = run_dir(tmp_path, "sequence", [[0.13, 0.14]] * 5, routing="sequence")
    cau = run_dir(tmp_path, "causal", [[0.15, 0.16]] * 4 + [[0.14, 0.2]])
    out = tmp_path / "res" / "collapse.json"
    rc = main(["collapse", f"softmax={soft}", f"sequence={seq}", f"causal={cau}", "--out", str(out), "--every", "2"])
    assert rc == 0
    doc = json.loads(out.read_text())
    v = doc["variants"]
    assert list(v) == ["softmax", "sequence", "causal"]
    assert v["softmax"]["normalisation"] == "softmax" and v["sequence"]["routing"] == "sequence"
    assert v["softmax"]["step"] == [1, 2, 4, 5]  # every 2nd step, plus the first and last
    assert first_collapse(v["softmax"]) == 4 and first_collapse(v["causal"]) is None
    png = out.with_suffix(".png")
    assert png.stat().st_size > 10_000  # a real figure (three panels), not an empty file
    (tmp_path / "res" / "retrofit_default.json").write_text(json.dumps(summary()))
    text = write_results(tmp_path / "res", tmp_path / "RESULTS.md").read_text()
    sec = text.split("## Collapse ablation")[1].split("\n## ")[0]
    assert "| softmax | softmax | — | 60 x 512 | 0.250 | 1.000 / 1.000 | 4 |" in sec
    assert "| causal | sinkhorn (10 iters) | causal | 60 x 512 | 0.155 | 0.170 / 0.200 | never |" in sec
    assert "within 600 steps" in sec and "![collapse](results/collapse.png)" in sec
    assert "softmax: mean share 1.000 after 5 steps, collapsed (mean >= 0.9) at step 4." in sec


def test_collapse_bad_input_names_what_is_missing(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(summary()))
    rc = main(["collapse", f"a={d}", "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "missing metrics.jsonl" in err and "focusattn retrofit --out" in err
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")  # an old run: no shares
    assert main(["collapse", f"a={d}", "--out", str(tmp_path / "c.json")]) == 2
    assert "no per-layer 'largest_share'" in capsys.readouterr().err
    assert main(["collapse", str(d), "--out", str(tmp_path / "c.json")]) == 2
    assert "expected NAME=RUN_DIR" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()
    with pytest.raises(ValueError, match="no runs"):
        collect({})


def test_sweep_table(tmp_path):
    pts = {"default": summary(ppl=30.0), "K4": summary(k=4, ppl=29.0, pk=(0.5, 1.0)), "K16": summary(k=16, ppl=31.0),
           "w64": summary(w=64, ppl=32.5), "tau0.5": summary(tau=0.5, ppl=33.25, dom=(0.9, 1.0)),
           "dg32": summary(dg=32, ppl=30.5)}
    rows = sweep_rows(pts)
    assert [(r["factor"], r["value"]) for r in rows] == [
        ("num_groups", 4), ("num_groups", 8), ("num_groups", 16), ("window", 64), ("window", 128),
        ("tau", 0.1), ("tau", 0.5), ("group_dim", 16), ("group_dim", 32)]
    md = sweeps_markdown(pts)
    assert "| K | 4 | 29.00 | 31.00 | 30.00 | 39.00 | 41.00 | 40.00 | 50.0% | 100.0% | 0.250 |" in md
    assert "| τ | 0.5 | 33.25 |" in md and "| K | **8** (default) | 30.00 |" in md and md.count("(default)") == 4
    assert "| τ | 0.5 | 33.25 | 35.25 | 34.25 | 43.25 | 45.25 | 44.25 | 30.0% | 50.0% | 0.950 |" in md
    for p, s in pts.items():
        (tmp_path / f"sweep_{p}.json").write_text(json.dumps(s))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "| w | 64 | 32.50 |" in text.split("## Sweeps")[1]


def test_sweep_table_refuses_points_that_are_not_one_factor():
    with pytest.raises(ValueError, match="no 'default' point"):
        sweep_rows({"K4": summary(k=4)})
    with pytest.raises(ValueError, match="vary no single swept factor"):
        sweep_rows({"default": summary(), "both": summary(k=4, w=64)})
    with pytest.raises(ValueError, match="budget differs"):
        sweep_rows({"default": summary(), "K4": summary(k=4, steps=10)})


def test_focus_vs_lora_table(tmp_path):
    (tmp_path / "retrofit_default.json").write_text(json.dumps(summary(ppl=30.0)))
    (tmp_path / "lora_r4.json").write_text(json.dumps(summary(method="lora", rank=4, ppl=21.5)))
    (tmp_path / "lora_r16.json").write_text(json.dumps(summary(method="lora", rank=16, ppl=20.25)))
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    sec = text.split("## Focus vs LoRA")[1].split("\n## ")[0]
    assert "| Focus (routers), soft / top-1 | 1,000 (1.000%) | 25.00 | 30.00 / 32.00 | 35.00 | 40.00 / 42.00 |" in sec
    assert "| LoRA r=4 (q,k,v,o) | 16,000 (16.000%) | 25.00 | 21.50 | 35.00 | 26.50 |" in sec
    assert "| LoRA r=16 (q,k,v,o) | 64,000 (64.000%) | 25.00 | 20.25 |" in sec and "Same budget for every row" in sec
    # a LoRA summary copied among the retrofit runs stays out of the Focus comparison table
    (tmp_path / "retrofit_lora.json").write_text(json.dumps(summary(method="lora", rank=4)))
    assert "| lora |" not in write_results(tmp_path, tmp_path / "RESULTS.md").read_text()


def test_empty_results_say_how_to_measure(tmp_path):
    text = write_results(tmp_path, tmp_path / "RESULTS.md").read_text()
    for target in ("make lora", "make ablation", "make sweeps", "focusattn groups"):
        assert target in text
