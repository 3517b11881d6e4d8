"""The adapters shipped inside the package: they load by name, stay causal and keep their groups balanced on held-out
text of another kind than their training corpus (news, not Shakespeare)."""
import pytest
import torch

import focusattn as fa
from focusattn import adapters
from focusattn.hf import last_routing

pytestmark = pytest.mark.realmodel
NAMES = adapters.shipped()


def _router_input(name):
    from focusattn.hf.io import read_adapter_config

    return read_adapter_config(adapters.HERE / name)["focus_config"].get("router_input", "hidden")


# the hidden-state routers' groups must stay balanced (the symmetric engine's cost is the sum of squared group
# sizes); a key-space router's key groups follow the keys, and its queries take groups to a budget instead
HIDDEN = [n for n in NAMES if _router_input(n) == "hidden"]
KEYS = [n for n in NAMES if _router_input(n) == "keys"]


def test_the_k8_adapter_ships():
    assert "smollm2-135m-focus-k8" in NAMES
    card = (adapters.HERE / "smollm2-135m-focus-k8" / "README.md").read_text()
    assert "focusattn retrofit" in card and "| split |" in card


def _routing_shares(name, data, n=2048):
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import tokenize

    model, tok = fa.load_model("smollm2-135m")
    fa.load_adapter(model, name)
    fa.set_top_k(model, 1)
    _, val = tokenize(load_corpus(data), tok, tokenizer_id="smollm2-135m")
    x = torch.as_tensor(val[:n][None].astype("int64"))
    with torch.no_grad():
        a = model(x).logits
    shares = [float(r.membership[0].sum(0).max()) / x.shape[1] for r in last_routing(model)]
    return model, val, x, a, shares, fa.hf.focus_config(model)


def test_the_g2_adapter_ships_with_its_serving_settings_and_commands():
    """The attention-objective routers: shipped with the cap and the copy heads, the card giving the training
    command and the measured tables' commands (by name, as a user loads it)."""
    from focusattn.hf.io import read_adapter_config

    assert "smollm2-135m-focus-g2" in NAMES
    cfg = read_adapter_config(adapters.HERE / "smollm2-135m-focus-g2")["focus_config"]
    assert cfg["capacity"] == 1.5 and cfg["rebalance_warm"] and len(cfg["dense_heads"]) == 10
    card = (adapters.HERE / "smollm2-135m-focus-g2" / "README.md").read_text()
    assert "focusattn retrofit --objective attention" in card
    assert "focusattn long-eval --adapter smollm2-135m-focus-g2" in card
    assert "focusattn bench-model --adapter smollm2-135m-focus-g2" in card


@pytest.mark.parametrize("name", NAMES)
def test_shipped_adapter_is_causal(name):
    model, val, x, a, _, _ = _routing_shares(name, "lee-news", 1024)
    y = x.clone()
    y[:, 700:] = torch.as_tensor(val[5000:5324][None].astype("int64"))
    with torch.no_grad():
        b = model(y).logits
    assert (a[:, :700] - b[:, :700]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", HIDDEN)
def test_groups_stay_balanced_on_held_out_text_of_the_training_kind(name):
    *_, shares, cfg = _routing_shares(name, "shakespeare")
    assert max(shares) <= 2 / cfg.num_groups, f"largest group per layer: {[round(s, 2) for s in shares]}"


@pytest.mark.parametrize("name", HIDDEN)
def test_groups_stay_balanced_on_text_of_another_kind(name):
    """As shipped (online rebalancing on): the offsets learned on Shakespeare alone put up to ~0.9 of news tokens in
    one group of a late layer (measured); re-estimating them from the sequence's own past keeps every layer <= 2/K."""
    *_, shares, cfg = _routing_shares(name, "lee-news")
    assert cfg.rebalance > 0
    assert max(shares) <= 2 / cfg.num_groups, f"largest group per layer: {[round(s, 2) for s in shares]}"


def test_the_key_space_adapter_ships_with_its_budget_and_commands():
    from focusattn.hf.io import read_adapter_config

    assert "smollm2-135m-focus-keys256" in KEYS
    cfg = read_adapter_config(adapters.HERE / "smollm2-135m-focus-keys256")["focus_config"]
    assert cfg["num_groups"] == 256 and cfg["budget"] == 0.12 and len(cfg["dense_heads"]) == 10
    card = (adapters.HERE / "smollm2-135m-focus-keys256" / "README.md").read_text()
    assert "focusattn fit-keys" in card and "--budget 0.12" in card
    assert "focusattn long-eval --adapter smollm2-135m-focus-keys256" in card
    assert "focusattn bench-model --adapter smollm2-135m-focus-keys256" in card


def test_the_means_adapter_is_keys256_served_with_means_and_measured_by_name():
    """The same centroids as keys256 (the card says so), ``key_scores="means"`` in its config, and a card whose
    measured rows come from runs of this very name (what a user loads)."""
    from focusattn.hf.io import read_adapter_config

    src, means = adapters.HERE / "smollm2-135m-focus-keys256", adapters.HERE / "smollm2-135m-focus-keys256-means"
    a, b = read_adapter_config(src), read_adapter_config(means)
    from focusattn.focus.config import FocusConfig

    fc = FocusConfig.from_dict  # older configs lack the newer fields: compare with their defaults filled in
    assert fc(b["focus_config"]) == fc({**a["focus_config"], "key_scores": "means"})
    assert b["weights_sha256"] == a["weights_sha256"]
    card = (means / "README.md").read_text()
    assert "focusattn ship-adapter smollm2-135m-focus-keys256 --name smollm2-135m-focus-keys256-means" in card
    assert "focusattn long-eval --adapter smollm2-135m-focus-keys256-means" in card
    assert "focusattn bench-model --adapter smollm2-135m-focus-keys256-means" in card


def _derived(source: str, name: str, changes: dict, flags: str):
    """``(expected config, shipped config, same weights, card lines missing)`` of ``name``, shipped from
    ``source``'s centroids with the config ``changes``: its card must give the ship command and measured rows from
    runs of this very name (what a user loads)."""
    from focusattn.focus.config import FocusConfig
    from focusattn.hf.io import read_adapter_config

    a, b = read_adapter_config(adapters.HERE / source), read_adapter_config(adapters.HERE / name)
    fc = FocusConfig.from_dict  # older configs lack the newer fields: compare with their defaults filled in
    card = (adapters.HERE / name / "README.md").read_text()
    lines = [f"focusattn ship-adapter {source} --name {name} {flags}", f"focusattn long-eval --adapter {name}",
             f"focusattn bench-model --adapter {name}"]
    return (fc({**a["focus_config"], **changes}), fc(b["focus_config"]), a["weights_sha256"] == b["weights_sha256"],
            [x for x in lines if x not in card])


def test_the_union_adapter_is_keys256_means_with_block_unions_and_measured_by_name():
    """keys256-means' centroids at a 4% budget, each query also keeping its block's groups (``union_block``)."""
    want, got, same_weights, missing = _derived("smollm2-135m-focus-keys256-means", "smollm2-135m-focus-keys256-union",
                                                {"budget": 0.04, "union_block": 64}, "--budget 0.04 --union-block 64")
    assert got == want and same_weights
    assert missing == []


def test_the_floor_adapter_is_keys256_union_with_a_floor_and_measured_by_name():
    """keys256-union's centroids and settings with at least 128 distant keys a query (``min_keys``)."""
    want, got, same_weights, missing = _derived("smollm2-135m-focus-keys256-union", "smollm2-135m-focus-keys256-floor",
                                                {"min_keys": 128}, "--min-keys 128")
    assert got == want and same_weights
    assert missing == []


def test_the_floor32_adapter_is_the_floor_with_32_token_unions_and_measured_by_name():
    """keys256-floor's centroids and settings, each query keeping its 32-token block's groups (``union_block``)."""
    want, got, same_weights, missing = _derived("smollm2-135m-focus-keys256-floor",
                                                "smollm2-135m-focus-keys256-floor32", {"union_block": 32},
                                                "--union-block 32")
    assert got == want and same_weights
    assert missing == []


@pytest.mark.parametrize("data", ["shakespeare", "lee-news"])
@pytest.mark.parametrize("name", KEYS)
def test_key_space_queries_keep_their_budget_on_held_out_text(name, data):
    """Each late query keeps about its budget of the distant keys (whole groups: within one group of it), on held-out
    text of the fitted kind and of another; no layer crowds its keys into one group (fitted at 2048 tokens, half of a
    layer's keys at 8192 fell in one: measured)."""
    model, val, x, a, shares, cfg = _routing_shares(name, data)
    assert max(shares) <= 0.25, f"largest group per layer: {[round(s, 2) for s in shares]}"
    t = x.shape[1]
    pos = torch.arange(t)
    for r in last_routing(model):
        ids = r.membership[0].float().argmax(-1)
        for i in (t // 2, t - 1):
            distant = (pos < i - cfg.window) & (pos >= cfg.sink_tokens)
            kept = int((r.query_membership[0, i][ids] & distant).sum())
            biggest = int(torch.bincount(ids[distant], minlength=cfg.num_groups).max())
            n = int(distant.sum())
            want = max(cfg.budget * n, min(cfg.min_keys, n))  # the share, at least the floor (min_keys)
            if cfg.union_block:  # its own budget, then the groups its block joined: at least the budget
                assert kept >= want - biggest
            else:
                assert abs(kept - want) <= biggest
