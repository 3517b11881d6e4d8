"""The key-space router on tiny random models: exact against the dense reference through the model, decode = prefill,
the adapter round trip and its refusals, the probes' view of it, and ``focusattn fit-keys`` end to end."""
import json

import pytest
import torch

import focusattn as fa
from focusattn.focus.config import FocusConfig
from focusattn.focus.key_router import KeyRouter
from focusattn.hf.compose import key_width
from focusattn.hf.kv import cache_kwargs, output_cache
from focusattn.train.key_fit import fit_key_centroids
from tests.conftest import assert_close, assert_round_trip, tiny_model, token_ids

CFG = FocusConfig(num_groups=6, window=4, router_input="keys", top_k=1, budget=0.3)


def keyed(arch="llama", cfg=CFG):
    m = tiny_model(arch)
    fa.compose(m, cfg)
    fit_key_centroids(m, token_ids(2, 64, seed=7).numpy())
    return m.eval()


UNION = FocusConfig(num_groups=6, window=4, router_input="keys", top_k=1, budget=0.1, key_scores="means",
                    union_block=5)
FLOOR = FocusConfig(num_groups=6, window=4, router_input="keys", top_k=1, budget=0.05, key_scores="means",
                    min_keys=6)


@pytest.mark.parametrize("arch, cfg", [("llama", CFG), ("gpt2", CFG), ("qwen2", CFG), ("gemma2", CFG),
                                       ("llama", UNION), ("llama", FLOOR)])
def test_served_model_equals_the_dense_reference_and_decodes_as_it_prefills(arch, cfg):
    """``UNION``: queries keep their block's groups (``union_block``, blocks of 5 across the 20-token prefill and the
    steps after it); ``FLOOR``: a budget of at least 6 distant keys (``min_keys``)."""
    m = keyed(arch, cfg)
    r = fa.hf.routers(m)[0]
    assert isinstance(r, KeyRouter) and r.centroids.shape == (6, key_width(m))
    assert fa.hf.focus_config(m).group_dim == key_width(m)
    x = token_ids(2, 48)
    with torch.no_grad():
        fast = m(x).logits
        ref = fa.hf.routing_caches(m)[0].query_membership()
        fa.hf.update_config(m, backend="dense")
        dense = m(x).logits
        fa.hf.update_config(m, backend="auto")
    assert_close(fast, dense, atol=1e-4, name=f"{arch} auto vs dense")
    assert ref.shape == (2, 48, 6) and bool(ref.any(-1).all())
    with torch.no_grad():  # a prefill of 20 tokens, then one token at a time
        out = m(x[:, :20], use_cache=True)
        cache, steps = output_cache(out), [out.logits[:, -1]]
        for i in range(20, 47):
            out = m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True)
            cache = output_cache(out)
            steps.append(out.logits[:, -1])
    assert_close(torch.stack(steps, 1), fast[:, 19:47], atol=1e-4, name=f"{arch} decode vs prefill")


def test_the_routing_keeps_what_its_budget_says():
    """A larger budget keeps more distant pairs, and the whole budget (1.0) keeps every one of them."""
    x = token_ids(1, 64)
    i, j = torch.arange(64)[:, None], torch.arange(64)[None]
    distant = (i - j > 4) & (j >= 1)  # beyond the window of 4, after the one sink
    kept = []
    for budget in (0.1, 0.5, 1.0):
        m = keyed(cfg=FocusConfig(num_groups=6, window=4, router_input="keys", top_k=1, budget=budget))
        with torch.no_grad():
            m(x)
        r = fa.hf.last_routing(m)[0]
        pairs = (r.query_membership[0].float() @ r.membership[0].float().t()) > 0
        kept.append(int((pairs & distant).sum()))
    assert kept[0] < kept[1] < kept[2] == int(distant.sum())


def test_the_cache_keeps_a_key_routers_groups_as_bool():
    """A key-space router's groups are its one-hot membership: the routing cache keeps the bool (a quarter of the
    float's bytes, through prefill and decode steps) and readers still get float groups equal to it."""
    m = keyed()
    x = token_ids(1, 40)
    with torch.no_grad():
        out = m(x[:, :32], use_cache=True)
        cache = output_cache(out)
        for i in range(32, 40):
            cache = output_cache(m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True))
    rc = fa.hf.routing_caches(m)[0]
    assert rc._groups.view().dtype == torch.bool and len(rc) == 40
    r = fa.hf.last_routing(m)[0]
    assert r.groups.dtype == torch.float32 and r.groups.shape == (1, 40, 6)
    assert torch.equal(r.groups, r.membership.float()) and bool((r.groups.sum(-1) == 1).all())


def test_adapter_round_trip_and_refusals(tmp_path):
    m = keyed()
    loaded = assert_round_trip(m, tmp_path / "a")
    assert fa.hf.focus_config(loaded).router_input == "keys"
    hidden = tiny_model("llama")
    fa.compose(hidden, FocusConfig(num_groups=6, group_dim=key_width(hidden)))
    with pytest.raises(ValueError, match="router_input='keys'"):
        fa.load_adapter(hidden, tmp_path / "a")
    with pytest.raises(ValueError, match="router_input"):
        fa.hf.update_config(loaded, router_input="hidden")
    with pytest.raises(ValueError, match="top_k"):
        fa.hf.set_top_k(loaded, None)  # no soft form: never a silent switch


def test_the_probes_see_the_key_features():
    """Attention recall reads the served mask of a key-space router from the same features it serves."""
    from focusattn.eval.recall import measure_recall

    m = keyed()
    rec = measure_recall(m, token_ids(1, 48).numpy(), top_ks=(1,), kmeans=True, oracle=True)
    masks = rec["overall"]["masks"]
    assert {"top1", "oracle@top1", "kmeans@top1"} <= set(masks)
    assert masks["oracle@top1"]["dropped_distant"] <= masks["top1"]["dropped_distant"] + 1e-6
    assert masks["top1"]["keys_per_query"] == pytest.approx(masks["oracle@top1"]["keys_per_query"])


def test_fit_keys_command(tmp_path, tiny_dir):
    from focusattn.cli import main

    out = tmp_path / "run"
    rc = main(["fit-keys", "--model", str(tiny_dir / "model"), "--corpora", str(tiny_dir / "corpus"), "--windows", "2",
               "--length", "64", "--groups", "4", "--budget", "0.25", "--window", "8", "--dense-heads", "1:0",
               "--out", str(out)])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["keys_per_layer"] == 128 and s["focus_config"]["router_input"] == "keys"
    assert s["focus_config"]["dense_heads"] == [[1, 0]]
    m = fa.load_adapter(fa.load_model(str(tiny_dir / "model"))[0], out / "adapter")
    c = fa.hf.routers(m)[0].centroids
    assert bool(c.abs().sum(-1).gt(0).all())  # fitted, not the zeros it was composed with
    # the groups report reads a learned router's soft groups: a key-space adapter is refused, in one line
    rc = main(["groups", "--model", str(tiny_dir / "model"), "--adapter", str(out / "adapter"), "--data",
               str(tiny_dir / "corpus"), "--out", str(tmp_path / "g")])
    assert rc != 0


def test_a_fitted_key_adapter_ships_at_a_budget_of_its_own(tmp_path, tiny_dir, capsys):
    """``ship-adapter`` on a ``fit-keys`` folder: the same centroids, the config at the budget it ships with, a card
    saying how it was fitted; settings a key-space adapter has no use for are one-line errors, and so is --budget on
    a folder that is not a fit."""
    from focusattn.analysis.model_card import ship_key_adapter
    from focusattn.cli import main

    out = tmp_path / "run"
    assert main(["fit-keys", "--model", str(tiny_dir / "model"), "--corpora", str(tiny_dir / "corpus"), "--windows",
                 "1", "--length", "64", "--groups", "4", "--budget", "0.25", "--window", "8", "--out", str(out)]) == 0
    shipped = ship_key_adapter(out, "tiny-keys", budget=0.5, dest=tmp_path / "ship")
    cfg = json.loads((shipped / "adapter_config.json").read_text())["focus_config"]
    assert cfg["budget"] == 0.5 and cfg["router_input"] == "keys"
    card = (shipped / "README.md").read_text()
    assert "fit-keys" in card and "--budget 0.5" in card and "k-means" in card
    m = fa.load_adapter(fa.load_model(str(tiny_dir / "model"))[0], shipped)
    assert fa.hf.focus_config(m).budget == 0.5
    fitted = fa.load_adapter(fa.load_model(str(tiny_dir / "model"))[0], out / "adapter")
    assert torch.equal(fa.hf.routers(m)[0].centroids, fa.hf.routers(fitted)[0].centroids)
    capsys.readouterr()
    for argv in (["ship-adapter", str(out), "--name", "x", "--capacity", "1.5"],
                 ["ship-adapter", str(tmp_path / "nothing"), "--name", "x", "--budget", "0.2"]):
        assert main(argv) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
    assert not (tmp_path / "x").exists()


def test_a_key_adapter_ships_again_with_other_key_scores(tmp_path, tiny_dir, capsys):
    """A shipped key-space adapter served with ``key_scores="means"`` under a new name: the same tensors, the new
    setting in its config (so loading the name serves it), a card pointing at the source; a hidden-state adapter,
    no change, or the source's own name are one-line errors that write nothing."""
    from focusattn.analysis.model_card import derive_key_adapter

    out = tmp_path / "run"
    assert main_ok(["fit-keys", "--model", str(tiny_dir / "model"), "--corpora", str(tiny_dir / "corpus"),
                    "--windows", "1", "--length", "64", "--groups", "4", "--budget", "0.25", "--window", "8",
                    "--out", str(out)])
    pkg = tmp_path / "pkg"
    shipped = derive_key_adapter(str(out / "adapter"), "tiny-means", key_scores="means", dest=pkg)
    cfg = json.loads((shipped / "adapter_config.json").read_text())["focus_config"]
    assert cfg["key_scores"] == "means" and cfg["budget"] == 0.25
    assert (shipped / "adapter.safetensors").read_bytes() == (out / "adapter" / "adapter.safetensors").read_bytes()
    card = (shipped / "README.md").read_text()
    assert "key_scores='means'" in card and "--key-scores means" in card and str(out / "adapter") in card
    m = fa.load_adapter(fa.load_model(str(tiny_dir / "model"))[0], shipped)
    assert fa.hf.focus_config(m).key_scores == "means"
    from focusattn._errors import InputError
    for kw in ({"key_scores": "nearest"}, {}):
        with pytest.raises((InputError, ValueError)):
            derive_key_adapter(str(out / "adapter"), "bad", dest=pkg, **kw)
    with pytest.raises(InputError, match="name"):
        derive_key_adapter(str(shipped), "tiny-means", key_scores="centroids", dest=pkg)
    with pytest.raises(InputError, match="router_input"):
        derive_key_adapter("smollm2-135m-focus-k8", "bad", key_scores="means", dest=pkg)
    union = derive_key_adapter(str(shipped), "tiny-union", budget=0.1, union_block=16, dest=pkg)
    cfg = json.loads((union / "adapter_config.json").read_text())["focus_config"]
    assert cfg["union_block"] == 16 and cfg["budget"] == 0.1 and cfg["key_scores"] == "means"
    assert "--union-block 16" in (union / "README.md").read_text()
    heads = derive_key_adapter(str(union), "tiny-heads", dense_heads="1:0", dest=pkg)  # another dense head
    cfg = json.loads((heads / "adapter_config.json").read_text())["focus_config"]
    assert cfg["dense_heads"] == [[1, 0]] and cfg["union_block"] == 16
    card = (heads / "README.md").read_text()
    assert "--dense-heads 1:0" in card and "1 dense key/value heads, layer:head `1:0` (the source's 0, and `1:0`" \
        in card
    loaded = fa.load_adapter(fa.load_model(str(tiny_dir / "model"))[0], heads)
    assert fa.hf.focus_config(loaded).dense_heads == ((1, 0),)
    with pytest.raises(InputError, match="dense_heads"):
        derive_key_adapter(str(union), "bad", dense_heads="induction:2", dest=pkg)  # scored: chosen before shipping
    assert fa.hf.focus_config(fa.load_adapter(fa.load_model(str(tiny_dir / "model"))[0], union)).union_block == 16
    with pytest.raises(InputError, match="union_block"):
        derive_key_adapter(str(shipped), "bad", union_block=-1, dest=pkg)
    floor = derive_key_adapter(str(union), "tiny-floor", min_keys=8, dest=pkg)
    card = (floor / "README.md").read_text()
    assert json.loads((floor / "adapter_config.json").read_text())["focus_config"]["min_keys"] == 8
    assert "--min-keys 8" in card and "at least 8" in card
    with pytest.raises(InputError, match="min_keys"):
        derive_key_adapter(str(shipped), "bad", min_keys=-1, dest=pkg)
    assert sorted(p.name for p in pkg.iterdir()) == ["tiny-floor", "tiny-heads", "tiny-means", "tiny-union"]


def main_ok(argv) -> bool:
    from focusattn.cli import main

    return main(argv) == 0


def test_fit_keys_fits_at_the_models_positions_by_default(tmp_path, tiny_dir):
    """Keys at positions never fitted on fall into a few groups, so the default fit covers every position."""
    from focusattn.cli import main

    rc = main(["fit-keys", "--model", str(tiny_dir / "model"), "--corpora", str(tiny_dir / "corpus"), "--groups", "4",
               "--out", str(tmp_path / "run")])
    assert rc == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["length"] == 256 and s["keys_per_layer"] == 256  # the tiny model's 256 positions, one window


def test_fit_keys_bad_input_is_one_line(tmp_path, tiny_dir, capsys):
    from focusattn.cli import main

    rc = main(["fit-keys", "--model", str(tiny_dir / "model"), "--corpora", str(tiny_dir / "corpus"),
               "--budget", "0", "--out", str(tmp_path / "r")])
    assert rc != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget" in err[0]
