"""Issue 22's scorecard: each check's pass and fail edges, runs merged by adapter name, baselines compared."""
from __future__ import annotations

from focusattn.analysis.scorecard import render_scorecards, scorecard

NAME = "smollm2-135m-focus-x"


def _doc(rows, ood="lee-news", adapter=NAME, command="focusattn long-eval --adapter " + NAME):
    return {"adapter": adapter, "command": command, "focus_config": {"num_groups": 8},
            "corpora": {"domain": "shakespeare", "ood": ood}, "results": rows}


def _row(t, variant, ppl=10.0, ood=20.0, repeat=1.5, hits=6, dropped=None, pairs=None):
    r = {"T": t, "variant": variant, "ppl_domain": ppl, "ppl_ood": ood, "repeat_ppl": repeat,
         "passkey": {"accuracy": hits / 6, "n": 6}}
    if dropped is not None:
        r["distant_dropped"] = {"domain": dropped, "ood": dropped}
    if pairs is not None:
        r["budget_pairs_kept"] = pairs
    return r


def _bench(speedup):
    return {"adapter": NAME, "command": f"focusattn bench-model --adapter {NAME} --out runs/b",
            "focus_config": {"num_groups": 8},
            "results": [{"T": 8192, "variant": "top1", "prefill_speedup": speedup, "decode_speedup": 1.0}]}


def _by(checks, target, where):
    return [c for c in checks if c["target"].startswith(target) and c["where"].startswith(where)]


def test_each_target_passes_at_its_edge_and_fails_past_it():
    docs = [_doc([_row(8192, "original"), _row(8192, "top1", ppl=10.2, ood=20.5, repeat=1.8, hits=5, dropped=0.3,
                                                pairs=0.25),
                  _row(8192, "oracle@top1", dropped=0.2)])]
    checks = scorecard(NAME, docs, [_bench(1.39)])
    ok = {c["target"].split(" ")[0] + " " + c["where"]: c["ok"] for c in checks}
    assert ok["causal T=8192"] is True  # 25% is within 25%
    assert ok["perplexity T=8192 domain"] is True  # +2.0%
    assert ok["perplexity T=8192 lee-news"] is False  # +2.5%
    assert ok["repeat-copy T=8192 lee-news"] is True  # 1.2x exactly
    assert ok["passkey T=8192 lee-news"] is True  # 5/6 of 6/6
    assert all(c["ok"] for c in _by(checks, "distant", "T=8192"))  # 1.5x exactly
    assert _by(checks, "prefill", "T=8192")[0]["ok"] is False  # 1.39x < 1.4x
    assert "runs/b" in _by(checks, "prefill", "T=8192")[0]["where"]


def test_misses_are_reported():
    docs = [_doc([_row(2048, "original", hits=6), _row(2048, "top1", repeat=1.81, hits=4, dropped=0.31),
                  _row(2048, "oracle@top1", dropped=0.2)])]
    checks = scorecard(NAME, docs, [])
    assert _by(checks, "repeat-copy", "T=2048")[0]["ok"] is False
    assert _by(checks, "passkey", "T=2048")[0]["value"] == "4/6 (original 6/6)"
    assert not any(c["ok"] for c in _by(checks, "distant", "T=2048"))


def test_a_baselines_only_run_merges_with_the_adapters_run_and_losses_are_named():
    own = _doc([_row(2048, "original"), _row(2048, "top1", ppl=10.1, dropped=0.2)])
    base = _doc([_row(2048, "sliding@top1", ppl=10.5, dropped=0.4), _row(2048, "kmeans@top1", ppl=10.05,
                                                                            dropped=0.25)])
    other = _doc([_row(2048, "top1", ppl=99.0)], adapter="another")  # another adapter's run: not merged
    checks = scorecard(NAME, [own, base, other], [])
    sliding, kmeans = _by(checks, "beats sliding", "T=2048")[0], _by(checks, "beats k-means", "T=2048")[0]
    assert sliding["ok"] and not kmeans["ok"]
    assert "domain perplexity (10.05 < 10.10)" in kmeans["value"]
    assert "attention dropped" not in kmeans["value"]
    assert _by(checks, "perplexity", "T=2048 domain")[0]["value"] == "+1.0%"


def test_another_register_adds_its_own_rows_but_not_the_training_registers_again():
    news = _doc([_row(2048, "original"), _row(2048, "top1")])
    code = _doc([_row(2048, "original", ood=8.0), _row(2048, "top1", ood=8.4)], ood="python-code")
    checks = scorecard(NAME, [news, code], [])
    assert len(_by(checks, "perplexity", "T=2048 domain")) == 1
    code_ppl = _by(checks, "perplexity", "T=2048 python-code")[0]
    assert code_ppl["value"] == "+5.0%" and not code_ppl["ok"]


def test_the_summary_lists_adapters_measured_at_both_lengths_with_their_misses():
    docs = [_doc([_row(2048, "original"), _row(2048, "top1", ppl=10.5)]),
            _doc([_row(8192, "original"), _row(8192, "top1", pairs=0.3)])]
    text = render_scorecards([NAME, "unmeasured"], docs, [])
    assert f"| `{NAME}` |" in text and "unmeasured" not in text
    assert "perplexity ≤ +2% (T=2048 domain)" in text and "causal pairs kept ≤ 25% (T=8192)" in text
    assert render_scorecards([NAME], docs[:1], []).startswith("_No adapter")
