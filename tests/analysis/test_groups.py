"""Group interpretability: the per-layer table (share, frequent tokens, purity, examples) and stability between two
routings, on hand-made assignments with known answers, then ``focusattn groups --compare`` on a tiny random model."""
import json

import numpy as np
import pytest

from focusattn.analysis.groups import group_table, render_markdown, stability
from focusattn.cli import main
from tests.conftest import char_tokenizer


def _ids(text):
    return np.array([[ord(c) - 32 for c in text]])


def test_group_table_known_purity():
    tok = char_tokenizer()
    ids = _ids("abab" "abcc")  # a x3... : a, b, a, b, a, b, c, c
    arg = np.array([[0, 1, 0, 1, 0, 0, 1, 1]])  # every 'a' -> G0; 'b' twice G1, once G0; 'c' -> G1
    rows = group_table(ids, arg, 3, tok, examples=2, context=2)
    g0, g1, g2 = rows
    assert g0["share"] == pytest.approx(4 / 8) and g1["share"] == pytest.approx(4 / 8) and g2["share"] == 0
    assert [(t["token"], t["count"]) for t in g0["tokens"]] == [("a", 3), ("b", 1)]
    assert [t["purity"] for t in g0["tokens"]] == pytest.approx([1.0, 1 / 3])
    # group purity: mean over its tokens of the token type's share routed here: (3 * 1 + 1 * 1/3) / 4
    assert g0["purity"] == pytest.approx((3 + 1 / 3) / 4)
    assert g1["purity"] == pytest.approx((2 * 2 / 3 + 2 * 1) / 4)
    assert g2["purity"] is None and g2["tokens"] == [] and g2["examples"] == []
    assert g0["examples"] == ["[[a]]b", "ba[[b]]c"]  # first and last occurrence, the token marked
    md = render_markdown({"adapter": "A", "data": "d", "windows": 1, "seq_len": 8, "num_groups": 3,
                          "tables": {"1": rows}, "command": "focusattn groups"})
    assert "| G0 | 0.500 | 0.83 | `a` 3 (1.00) `b` 1 (0.33) | [[a]]b |" in md


def test_stability_counts_kept_groups_and_relabelling():
    a = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    assert stability(a, a, 4)["same_index"] == 1.0
    perm = np.array([2, 3, 0, 1])[a]  # the same partition under other group numbers
    s = stability(a, perm, 4)
    assert s["same_index"] == 0.0 and s["matched"] == 1.0 and s["chance"] == 0.25 and s["tokens"] == 8
    b = a.copy()
    b[:2] = 1  # two tokens move
    assert stability(a, b, 4)["same_index"] == pytest.approx(6 / 8)


def test_groups_cli_table_and_stability_against_a_checkpoint(tmp_path, tiny_dir, capsys):
    run = tmp_path / "run"
    base = ["--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"), "--seq-len", "48"]
    assert main(["retrofit", *base, "--ood-data", "none", "--out", str(run), "--groups", "4", "--window", "8",
                 "--eval-windows", "1", "--steps", "2", "--checkpoint-every", "1", "--eval-top-k", "1"]) == 0
    out = tmp_path / "g"
    rc = main(["groups", *base, "--adapter", str(run), "--out", str(out), "--eval-windows", "2", "--layers", "0,1",
               "--compare", str(run / "checkpoint.pt"), "--examples", "2", "--key-top-k", "2"])
    assert rc == 0
    g = json.loads((out / "groups.json").read_text())
    kept = g["pairs_kept"]  # query top-1 / key top-2 keeps between symmetric top-1 and top-2
    assert kept["top1"] <= kept["top1key2"] <= kept["top2"] and kept["top1"] < kept["top2"]
    assert set(g["tables"]) == {"0", "1"} and len(g["tables"]["1"]) == 4
    for rows in g["tables"].values():
        assert sum(r["share"] for r in rows) == pytest.approx(1.0)
        assert all(r["purity"] is None or r["share"] - 1e-9 <= r["purity"] <= 1 for r in rows)
    # the checkpoint is the last step's routers: every token keeps its group
    assert g["stability"]["1"]["same_index"] == 1.0 and g["stability"]["0"]["tokens"] == 2 * 48
    assert "| layer | same group number |" in (out / "groups.md").read_text()
    # attention recall of the served masks on the same windows, beside the oracle at each one's budget
    rec = g["recall"]
    assert rec["T"] == 48 and rec["windows"] == 2 and len(rec["layers"]) == 2
    masks = rec["overall"]["masks"]
    assert {"top1", "top2", "top1key2", "oracle@top1", "oracle@top2", "oracle@top1key2"} <= set(masks)
    for n in ("top1", "top2", "top1key2"):  # the oracle keeps as many distant keys, the most attended ones
        assert masks[f"oracle@{n}"]["dropped_distant"] <= masks[n]["dropped_distant"] + 1e-6
        assert masks[f"oracle@{n}"]["keys_per_query"] == pytest.approx(masks[n]["keys_per_query"])
        for lay in rec["layers"]:
            drop = {k: v["dropped_distant"] for k, v in lay["masks"].items()}
            assert 0 <= drop[f"oracle@{n}"] <= drop[n] + 1e-6 <= 1 + 1e-6
    assert masks["top2"]["keys_per_query"] >= masks["top1"]["keys_per_query"]  # top-2 keeps a superset
    assert masks["top2"]["dropped_distant"] <= masks["top1"]["dropped_distant"] + 1e-6
    assert "| mask | distant attention dropped |" in (out / "groups.md").read_text()
    printed = capsys.readouterr().out
    assert "stability layer 1: same group 1.000" in printed and "distant attention dropped: top1:" in printed
    # a layer that does not exist, and a checkpoint used alone, are refused before any work
    assert main(["groups", *base, "--adapter", str(run), "--out", str(tmp_path / "x"), "--layers", "7"]) == 2
    assert "--layers [7]: the model has layers 0..1" in capsys.readouterr().err
    assert main(["groups", *base, "--adapter", str(run / "checkpoint.pt"), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_groups_update_summary_missing_is_named_before_any_work(tmp_path, capsys, monkeypatch):
    import focusattn.analysis.cli as acli

    monkeypatch.setattr(acli, "groups_report", lambda *a, **k: pytest.fail("ran before checking its inputs"))
    rc = main(["groups", "--adapter", "smollm2-135m-focus-k8", "--update-summary", str(tmp_path), "--out",
               str(tmp_path / "g")])
    err = capsys.readouterr().err
    assert rc == 2 and "missing summary.json" in err and "focusattn retrofit --out RUN" in err


def test_pairs_kept_of_a_query_projection_counts_the_served_mask():
    """With ``query_proj`` the top-1 share is the served mask's (queries by their own projection), the same number
    ``long-eval`` reports, not the symmetric count of the key groups."""
    import torch

    import focusattn as fa
    from focusattn.analysis.groups import group_stats
    from focusattn.eval.longctx import pairs_kept
    from focusattn.hf import routers
    from tests.conftest import V, tiny_model

    torch.manual_seed(0)
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, query_proj=True)).eval()
    with torch.no_grad():
        for r in routers(m):
            r.proj_q.weight.normal_()
    w = np.random.default_rng(0).integers(1, V, (1, 40))
    got = group_stats(m, w, top_ks=(1,))["pairs_kept"]["top1"]
    fa.set_top_k(m, 1)
    with torch.no_grad():
        want = pairs_kept(m, w[0])
    assert got == pytest.approx(want)



def test_group_stats_count_the_capped_groups(monkeypatch):
    """With ``capacity`` the top-k shares are those of the capped memberships the model serves (of the same soft
    groups): fewer pairs than the uncapped count where one group draws every token."""
    import torch

    import focusattn as fa
    from focusattn.analysis.groups import group_stats
    from focusattn.focus import router as R
    from focusattn.hf import routers, update_config
    from tests.conftest import tiny_model

    monkeypatch.setattr(R, "CAPACITY_BLOCK", 4)
    torch.manual_seed(0)
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, capacity=1.2)).eval()
    with torch.no_grad():
        for r in routers(m):
            r.centroids[0] += 5.0 * r.proj.weight.sum(1) / r.proj.weight.sum(1).norm()  # one group everyone wants
    w = np.random.default_rng(0).integers(1, 90, (1, 48))
    capped = group_stats(m, w, top_ks=(1,))
    update_config(m, capacity=0.0)
    plain = group_stats(m, w, top_ks=(1,))
    assert capped["layers"] == plain["layers"]  # the same soft groups
    assert capped["pairs_kept"]["top1"] < plain["pairs_kept"]["top1"]
