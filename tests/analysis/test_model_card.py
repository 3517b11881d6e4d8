import json
import shutil
from pathlib import Path

import pytest

import focusattn as fa
from focusattn.analysis.model_card import ship_adapter
from tests.conftest import tiny_model

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _run_dir(tmp_path) -> Path:
    run = tmp_path / "run"
    m = fa.compose(tiny_model("llama"), fa.FocusConfig(num_groups=4, window=4))
    fa.save_adapter(m, run / "adapter")
    shutil.copy(RESULTS / "retrofit_default.json", run / "summary.json")
    return run


def test_ship_adapter_writes_the_files_and_a_model_card(tmp_path):
    run = _run_dir(tmp_path)
    out = ship_adapter(run, "tiny-focus-k4", dest=tmp_path / "pkg")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "adapter.safetensors", "adapter_config.json"]
    card = (out / "README.md").read_text()
    assert 'fa.load_adapter(model, "tiny-focus-k4")' in card
    summary = json.loads((run / "summary.json").read_text())
    assert summary["command"] in card  # how it was trained, with the command
    assert f"{summary['perplexity']['before']['domain']:.2f}" in card  # its measured table
    assert not (tmp_path / "pkg" / "tiny-focus-k4.tmp").exists()


def test_ship_adapter_names_what_is_missing(tmp_path):
    run = _run_dir(tmp_path)
    (run / "summary.json").unlink()
    with pytest.raises(ValueError, match="missing summary.json .*focusattn retrofit"):
        ship_adapter(run, "x", dest=tmp_path / "pkg")
    run = _run_dir(tmp_path / "b")
    (run / "adapter" / "adapter.safetensors").unlink()
    with pytest.raises(ValueError, match="missing adapter/adapter.safetensors"):
        ship_adapter(run, "x", dest=tmp_path / "pkg")
    with pytest.raises(ValueError, match="plain folder name"):
        ship_adapter(_run_dir(tmp_path / "c"), "../evil", dest=tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_ship_adapter_refuses_a_lora_run(tmp_path):
    import json

    from focusattn.analysis.model_card import ship_adapter

    (tmp_path / "summary.json").write_text(json.dumps({"method": "lora"}))
    with pytest.raises(ValueError, match="a lora run .*ships Focus adapters"):
        ship_adapter(tmp_path, "x", dest=tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_ship_adapter_gives_both_commands_of_a_continued_run(tmp_path):
    first = _run_dir(tmp_path / "a")
    run = _run_dir(tmp_path / "b")
    s = json.loads((run / "summary.json").read_text())
    s["command"] = "focusattn retrofit --init-adapter A --distill 1.0 --repeat-prob 0.25"
    s["config"].update(init_adapter="A", distill=1.0, repeat_prob=0.25)
    (run / "summary.json").write_text(json.dumps(s))
    card = (ship_adapter(run, "tiny-continued", dest=tmp_path / "pkg", first_phase=first) / "README.md").read_text()
    first_cmd = json.loads((first / "summary.json").read_text())["command"]
    assert f"First: `{first_cmd}`" in card and s["command"] in card
    assert "distilled from the original model" in card and "25% of the windows" in card


def test_derive_adapter_ships_the_same_routers_with_dense_heads(tmp_path, tiny_dir):
    from focusattn.analysis.model_card import derive_adapter
    from focusattn.hf.io import read_adapter_config

    model_dir = str(tiny_dir / "model")
    m, _ = fa.load_model(model_dir)
    src = fa.save_adapter(fa.compose(m, fa.FocusConfig(num_groups=4, window=4)), tmp_path / "src")
    out = derive_adapter(str(src), "tiny-heads1", dense_heads="induction:1", model=model_dir, dest=tmp_path / "pkg")
    cfg = read_adapter_config(out)
    assert len(cfg["focus_config"]["dense_heads"]) == 1
    assert cfg["weights_sha256"] == read_adapter_config(src)["weights_sha256"]  # the same tensors
    card = (out / "README.md").read_text()
    assert f"The routers of `{src}`" in card and "--dense-heads induction:1" in card
    named = derive_adapter(str(src), "tiny-named", dense_heads="1:0", model=model_dir, dest=tmp_path / "pkg")
    assert read_adapter_config(named)["focus_config"]["dense_heads"] == [[1, 0]]
    with pytest.raises(ValueError, match="dense_heads"):
        derive_adapter(str(src), "bad", dense_heads="9:0", model=model_dir, dest=tmp_path / "pkg")
    assert not (tmp_path / "pkg" / "bad").exists()


def test_ship_adapter_serves_warm_rebalancing_and_scored_dense_heads(tmp_path, tiny_dir):
    """A retrofit folder shipped with inference settings of its own: warm rebalancing, and dense heads scored on
    the run's model (both kinds) or named; the card says how they were chosen; a bad spec writes nothing."""
    from focusattn.hf.io import read_adapter_config

    model_dir = str(tiny_dir / "model")
    m, _ = fa.load_model(model_dir)
    run = tmp_path / "run"
    fa.save_adapter(fa.compose(m, fa.FocusConfig(num_groups=4, window=4, rebalance=8)), run / "adapter")
    s = json.loads((RESULTS / "retrofit_default.json").read_text())
    s["config"]["model"] = model_dir
    (run / "summary.json").write_text(json.dumps(s))
    out = ship_adapter(run, "tiny-copy2", dest=tmp_path / "pkg", rebalance_warm=True, capacity=1.5,
                       dense_heads="induction:1+duplicate:1")
    cfg = read_adapter_config(out)["focus_config"]
    assert cfg["rebalance_warm"] is True and len({tuple(h) for h in cfg["dense_heads"]}) == 2
    assert cfg["capacity"] == 1.5
    card = (out / "README.md").read_text()
    assert "warm-started rebalancing" in card and "--dense-heads induction:1+duplicate:1" in card
    assert "capped at 1.5x the balanced share" in card
    assert f"Shipped by: `focusattn ship-adapter {run} --name tiny-copy2 --rebalance-warm --capacity 1.5 " \
        "--dense-heads induction:1+duplicate:1`" in card
    assert "duplicate-token score" in card
    named = ship_adapter(run, "tiny-named", dest=tmp_path / "pkg", dense_heads="1:0")
    assert read_adapter_config(named)["focus_config"]["dense_heads"] == [[1, 0]]
    with pytest.raises(ValueError, match="dense_heads"):
        ship_adapter(run, "bad", dest=tmp_path / "pkg", dense_heads="copy:2")
    with pytest.raises(ValueError, match="capacity"):
        ship_adapter(run, "bad", dest=tmp_path / "pkg", capacity=0.5)
    assert not (tmp_path / "pkg" / "bad").exists() and not (tmp_path / "pkg" / "bad.tmp").exists()


def test_refresh_card_rewrites_only_the_measured_tables(tmp_path):
    """A re-measurement (new kernels) updates a shipped card's tables without its training run; the account of how
    the adapter was made stays, and asking for nothing is a one-line error."""
    from focusattn.analysis.model_card import refresh_card

    out = ship_adapter(_run_dir(tmp_path), "tiny-focus-k4", dest=tmp_path / "pkg",
                       model_bench=RESULTS / "model_bench_k8.json")
    head = (out / "README.md").read_text().split("## Whole-model speed")[0]
    bench = json.loads((RESULTS / "model_bench_g2.json").read_text())
    (tmp_path / "mb.json").write_text(json.dumps(bench))
    refresh_card("tiny-focus-k4", model_bench=tmp_path / "mb.json", dest=tmp_path / "pkg")
    card = (out / "README.md").read_text()
    assert card.startswith(head) and card.count("## Whole-model speed") == 1
    assert f"{bench['results'][-1]['prefill_s']:.2f}" in card
    with pytest.raises(ValueError, match="needs --long-eval and/or --model-bench"):
        refresh_card("tiny-focus-k4", dest=tmp_path / "pkg")


def test_refresh_card_merges_several_long_evals_and_renames_older_kmeans_rows(tmp_path):
    """A baseline re-measured in its own run joins the adapter's rows in the card; k-means rows of the older rule
    (not at the router's budget) are shown as ``kmeans-share``, never as the baseline at the same budget."""
    from focusattn.analysis.model_card import refresh_card
    from focusattn.eval.longctx import KMEANS_RULE

    out = ship_adapter(_run_dir(tmp_path), "tiny-focus-k4", dest=tmp_path / "pkg")
    cfg = {"num_groups": 4}
    old = {"adapter": "tiny", "focus_config": cfg, "command": "focusattn long-eval --adapter tiny", "results": [
        {"T": 64, "variant": "original", "ppl_domain": 10.0, "ppl_ood": 10.0},
        {"T": 64, "variant": "top1", "ppl_domain": 11.0, "ppl_ood": 11.0, "budget_pairs_kept": 0.5},
        {"T": 64, "variant": "kmeans@top1", "ppl_domain": 19.0, "ppl_ood": 19.0, "budget_pairs_kept": 0.5}]}
    new = {"adapter": "tiny", "focus_config": cfg, "command": "focusattn long-eval --adapter tiny --baselines kmeans",
           "kmeans_rule": KMEANS_RULE, "results": [
               {"T": 64, "variant": "kmeans@top1", "ppl_domain": 10.5, "ppl_ood": 10.5, "budget_pairs_kept": 0.5}]}
    for name, doc in (("old.json", old), ("new.json", new)):
        (tmp_path / name).write_text(json.dumps(doc))
    refresh_card("tiny-focus-k4", long_eval=[tmp_path / "old.json", tmp_path / "new.json"], dest=tmp_path / "pkg")
    card = (out / "README.md").read_text()
    assert "| kmeans-share@top1 | 19.00 (+90.0%)" in card and "| kmeans@top1 | 10.50 (+5.0%)" in card
