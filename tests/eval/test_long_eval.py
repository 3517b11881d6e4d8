"""End-to-end pieces on the real default model: the long-context probes, the baselines at the same budget, the
whole-model benchmark, and adapters by name. Lengths are tiny here; the measured runs are in docs/RESULTS.md."""
import json
import sys

import numpy as np
import pytest

import focusattn as fa
from focusattn.cli import main
from focusattn.eval.probes import passkey_sequences, repeat_copy_sequences

pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    model, _ = fa.load_model("smollm2-135m")
    fa.compose(model, fa.FocusConfig(num_groups=4, window=16))
    return str(fa.save_adapter(model, tmp_path_factory.mktemp("a") / "adapter"))


def test_repeat_copy_sequences_hold_two_copies_far_apart():
    ids = np.arange(5000) % 997
    for seq, start in repeat_copy_sequences(ids, 1500, passage=100, distance=600, n=3):
        assert len(seq) == 1500 and start == 1400
        assert np.array_equal(seq[start:], seq[start - 600:start - 500])
    with pytest.raises(ValueError, match="cannot hold"):
        repeat_copy_sequences(ids, 500, passage=100, distance=600)


def test_passkey_sequences_have_exact_length_and_end_with_the_key():
    _, tok = fa.load_model("smollm2-135m")
    ids = np.asarray(tok("The quick brown fox jumps over the lazy dog. " * 200).input_ids)
    seqs = passkey_sequences(ids, tok, 300, depths=(0.0, 0.5, 1.0))
    for s in seqs:
        assert len(s["tokens"]) == 300
        answer = tok.decode(s["tokens"][-s["answer_len"]:].tolist())
        assert str(s["key"]) in answer
        assert tok.decode(s["tokens"].tolist()).count(str(s["key"])) == 3  # twice in the needle, once as the answer
    assert seqs[0]["distance"] > seqs[2]["distance"]  # depth 0 = far from the question


def test_long_eval_runs_every_variant_and_the_original_finds_the_passkey(adapter_dir, tmp_path):
    out = tmp_path / "le"
    rc = main(["long-eval", "--adapter", adapter_dir, "--lengths", "320", "--top-k", "1", "--ppl-windows", "1",
               "--repeat-n", "1", "--threads", "2", "--recall-windows", "1", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "long_eval.json").read_text())
    names = [r["variant"] for r in doc["results"]]
    assert names == ["original", "soft", "top1", "sliding@top1", "random@top1", "untrained@top1", "kmeans@top1",
                     "oracle@top1"]
    # attention recall on both splits: the oracle at top-1's budget never drops more than top-1 itself
    assert [(r["T"], r["split"]) for r in doc["recall"]] == [(320, "domain"), (320, "ood")]
    for rec in doc["recall"]:
        masks = rec["overall"]["masks"]
        assert masks["oracle@top1"]["dropped_distant"] <= masks["top1"]["dropped_distant"]
        assert len(rec["layers"]) == 30 and 0 < rec["overall"]["share"]["distant"] < 1
    assert set(doc["results"][2]["distant_dropped"]) == {"domain", "ood"}
    orig = doc["results"][0]
    assert orig["passkey"]["accuracy"] >= 2 / 3  # the probe is solvable by the full model at this length
    assert orig["repeat_ppl"] < 0.5 * orig["ppl_ood"]  # the second copy is predicted from the first
    for r in doc["results"][2:]:
        assert 0 < r["budget_pairs_kept"] < 1
    sliding = doc["results"][3]
    from focusattn.hf.baselines import pairs_kept_sliding

    assert pairs_kept_sliding(320, sliding["window"]) >= sliding["budget_pairs_kept"]


def test_long_eval_serves_induction_heads_dense_beside_the_duo_baseline(adapter_dir, tmp_path):
    """--dense-heads induction:N+duplicate:M measures the heads on the loaded model, records them, counts them in
    the budget and gives the DuoAttention-style baseline (the same dense heads, a window elsewhere) at that budget."""
    out = tmp_path / "le"
    argv = ["long-eval", "--adapter", adapter_dir, "--lengths", "320", "--top-k", "1", "--ppl-windows", "1",
            "--repeat-n", "1", "--threads", "2", "--recall-windows", "1", "--no-soft",
            "--variants", "original,top1,sliding@top1,duo@top1", "--baselines", "sliding,duo,oracle"]
    assert main(argv + ["--dense-heads", "induction:2+duplicate:1", "--out", str(out)]) == 0
    doc = json.loads((out / "long_eval.json").read_text())
    heads = doc["focus_config"]["dense_heads"]
    assert len(heads) == 3 and [17, 1] in heads and [18, 2] in heads  # SmolLM2's two strongest induction heads
    assert [8, 0] in heads or [14, 1] in heads  # and its strongest duplicate-token head
    rows = {r["variant"]: r for r in doc["results"]}
    assert list(rows) == ["original", "top1", "sliding@top1", "duo@top1"]
    assert rows["duo@top1"]["window"] < rows["sliding@top1"]["window"]  # part of the budget went to dense heads
    masks = doc["recall"][0]["overall"]["masks"]
    assert masks["oracle@top1"]["dropped_distant"] <= masks["top1"]["dropped_distant"]
    assert set(masks) >= {"top1", "duo@top1", "sliding@top1", "oracle@top1"}
    assert main(argv + ["--dense-heads", "none", "--out", str(tmp_path / "none")]) == 0
    plain = json.loads((tmp_path / "none" / "long_eval.json").read_text())
    assert [r["variant"] for r in plain["results"]] == ["original", "top1", "sliding@top1"]  # no duo without heads
    assert plain["results"][1]["budget_pairs_kept"] < rows["top1"]["budget_pairs_kept"]


def test_bench_model_times_the_learned_routing(adapter_dir, tmp_path):
    out = tmp_path / "bm"
    rc = main(["bench-model", "--adapter", adapter_dir, "--lengths", "256", "--top-k", "1", "--repeats", "1",
               "--decode-tokens", "2", "--threads", "2", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "model_bench.json").read_text())
    rows = {r["variant"]: r for r in doc["results"]}
    assert set(rows) == {"original", "top1"}
    assert rows["original"]["prefill_speedup"] == 1.0
    r = rows["top1"]
    assert r["prefill_s"] > 0 and r["decode_s"] > 0 and 0 < r["attention_share"] < 1
    assert r["prefill_cpu_s"] > 0 and r["decode_cpu_s"] > 0 and rows["original"]["prefill_cpu_speedup"] == 1.0
    assert len(r["routing"]["layers"]) == 30
    assert all(1 / 4 <= x["largest_share"] <= 1 for x in r["routing"]["layers"])
    if sys.platform.startswith("linux"):  # peaks come from the last pass, after every timing
        assert all(row["peak_bytes"] > 0 for row in doc["results"])
    assert (out / "model_bench.png").stat().st_size > 0


def test_bench_model_prefill_ratio_pairs_each_variant_with_an_adjacent_original_prefill(adapter_dir, tmp_path,
                                                                                         monkeypatch):
    """Each variant's prefill runs right after an original's prefill, and its prefill x is the median over repeats
    of those adjacent pairs' ratios (a drifting machine speed then cancels in each ratio)."""
    import statistics

    import focusattn.bench.model as BM

    made = []

    class Spy(BM._Decoder):
        def __init__(self, model, x, clock):
            super().__init__(model, x, clock)
            made.append((id(clock), x.shape[1], self.prefill))

    monkeypatch.setattr(BM, "_Decoder", Spy)
    out = tmp_path / "bm"
    assert main(["bench-model", "--adapter", adapter_dir, "--lengths", "300", "--top-k", "1", "2", "--repeats", "2",
                 "--decode-tokens", "1", "--threads", "1", "--out", str(out)]) == 0
    rows = {r["variant"]: r for r in json.loads((out / "model_bench.json").read_text())["results"]}
    timed = [m for m in made if m[1] == 300]  # the warm-up prefills are shorter (256)
    base = timed[0][0]
    assert [m[0] == base for m in timed] == [True, False, True, False] * 2  # orig, top1, orig, top2 per repeat
    for j, name in ((1, "top1"), (3, "top2")):
        ratios = [timed[i + j - 1][2] / timed[i + j][2] for i in (0, 4)]
        assert rows[name]["prefill_paired"] and rows[name]["prefill_speedup"] == pytest.approx(
            statistics.median(ratios))


@pytest.mark.parametrize("argv, message", [(["--variants", "original,top9"], "--variants original,top9: unknown top9"),
                                           (["--baselines", "sliding,lsh"], "--baselines sliding,lsh: unknown lsh")])
def test_long_eval_unknown_variant_or_baseline_is_one_line(adapter_dir, tmp_path, capsys, argv, message):
    out = tmp_path / "le"
    assert main(["long-eval", "--adapter", adapter_dir, "--out", str(out)] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["--adapter", "no-such-adapter"], "shipped"),
    (["--lengths", "9000"], "exceeds the model's 8192 positions"),
    (["--top-k", "5"], "out of range"),
    (["--dense-heads", "17"], "--dense-heads 17: allowed 'none'"),
])
def test_bench_model_and_long_eval_bad_input_is_one_line_and_writes_nothing(adapter_dir, tmp_path, capsys, argv,
                                                                             message):
    for cmd in ("bench-model", "long-eval"):
        out = tmp_path / cmd
        args = [cmd, "--adapter", adapter_dir, "--out", str(out)] + argv
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
        assert not out.exists()


def test_adapters_load_by_name_and_refuse_another_k(adapter_dir, monkeypatch, tmp_path):
    import shutil

    from focusattn import adapters

    shipped = tmp_path / "pkg"
    shutil.copytree(adapter_dir, shipped / "test-adapter")
    monkeypatch.setattr(adapters, "HERE", shipped)
    assert adapters.shipped() == ["test-adapter"]
    model, _ = fa.load_model("smollm2-135m")
    fa.load_adapter(model, "test-adapter")
    assert fa.hf.focus_config(model).num_groups == 4
    with pytest.raises(ValueError, match="shipped: test-adapter"):
        fa.load_adapter(model, "other-adapter")
    other, _ = fa.load_model("smollm2-135m")
    fa.compose(other, fa.FocusConfig(num_groups=8))
    with pytest.raises(ValueError, match="K=4"):
        fa.load_adapter(other, "test-adapter")


def test_long_eval_of_a_lazy_adapter_on_the_real_model(tmp_path):
    """A Lazy adapter: the original and Elastic-Softmax rows on the same inputs; a small tau changes little, and
    tau = 0 (free) would be the original exactly (tests/hf/test_lazy.py)."""
    from focusattn.hf.lazy import compose_lazy, save_lazy_adapter
    from focusattn.lazy import ElasticConfig

    model, _ = fa.load_model("smollm2-135m")
    compose_lazy(model, ElasticConfig(tau_init=0.05, train_tau=False))
    save_lazy_adapter(model, tmp_path / "lazy")
    out = tmp_path / "le"
    rc = main(["long-eval", "--adapter", str(tmp_path / "lazy"), "--lengths", "320", "--ppl-windows", "1",
               "--repeat-n", "1", "--threads", "2", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "long_eval.json").read_text())
    orig, lazy = doc["results"]
    assert (orig["variant"], lazy["variant"]) == ("original", "lazy") and doc["lazy_config"]["tau_init"] == 0.05
    assert lazy["ppl_domain"] != orig["ppl_domain"]
    assert abs(lazy["ppl_domain"] / orig["ppl_domain"] - 1) < 0.1


@pytest.mark.parametrize("name", ["smollm2-135m-focus-keys256", "smollm2-135m-focus-keys256-floor"])
def test_the_key_space_adapter_has_a_random_baseline_and_no_untrained_one(tmp_path, capsys, name):
    """The shipped key-space adapters by name: their random baseline (random key groups, each query filled to the
    router's own count) keeps about the distant keys per query the router keeps, as the recall pass measures them
    (served as a random routing with the floor's block union it kept most of them); an untrained baseline, which a
    key-space adapter has no use for (nothing is trained), is a one-line error."""
    out = tmp_path / "le"
    argv = ["long-eval", "--adapter", name, "--lengths", "1024", "--ppl-windows", "1", "--top-k", "1",
            "--repeat-n", "1", "--threads", "1", "--no-soft", "--passkey-per-depth", "1"]
    assert main(argv + ["--baselines", "random", "--recall-windows", "1", "--out", str(out)]) == 0
    doc = json.loads((out / "long_eval.json").read_text())
    rows = {r["variant"]: r for r in doc["results"]}
    assert list(rows) == ["original", "top1", "random@top1"]
    masks = doc["recall"][0]["overall"]["masks"]
    kept = masks["top1"]["keys_per_query"]
    assert abs(masks["random@top1"]["keys_per_query"] / kept - 1) < 0.1
    assert masks["random@top1"]["dropped_distant"] > masks["top1"]["dropped_distant"]  # chance, not the router
    assert rows["random@top1"]["distant_dropped"]["domain"] == masks["random@top1"]["dropped_distant"]
    capsys.readouterr()
    assert main(argv + ["--baselines", "untrained", "--out", str(tmp_path / "u")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "untrained" in err[0]
    assert not (tmp_path / "u").exists()
