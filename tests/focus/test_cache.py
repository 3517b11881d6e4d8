"""``RoutingCache``: decode steps append to the prefill's routing; readers see every cached token."""
import pytest
import torch

import focusattn as fa
from focusattn.hf import last_routing, routing_caches, update_config
from focusattn.hf.kv import cache_kwargs, output_cache
from tests.conftest import V, tiny_model


@pytest.mark.parametrize("top_k,rebalance,warm", [(None, 0, False), (1, 0, False), (None, 8, False), (2, 7, False),
                                                 (1, 7, True)])
def test_prefill_plus_decode_steps_equal_one_prefill(top_k, rebalance, warm, monkeypatch):
    """A prefill and decode steps route like one prefill, however each step routes: hard steps take
    ``FocusRouter.decode`` (the lean step) except the first step of a rebalancing interval (``forward``)."""
    lean = []
    real = fa.FocusRouter.decode
    monkeypatch.setattr(fa.FocusRouter, "decode", lambda self, *a: lean.append(real(self, *a)) or lean[-1])
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=top_k, rebalance=rebalance,
                                 rebalance_warm=warm)).eval()
    x = torch.randint(1, V, (2, 40))
    with torch.no_grad():
        m(x)
        whole = [r.groups.clone() for r in last_routing(m)], [r.membership for r in last_routing(m)]
        out = m(x[:, :20], use_cache=True)
        cache = output_cache(out)
        for i in range(20, 40):  # one token at a time, past the first capacity doubling
            cache = output_cache(m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True))
    for layer, r in enumerate(last_routing(m)):
        assert len(routing_caches(m)[layer]) == 40
        torch.testing.assert_close(r.groups, whole[0][layer])
        if top_k is None:
            assert r.membership is None
        else:
            assert torch.equal(r.membership, whole[1][layer])
    taken = sum(r is not None for r in lean)
    if top_k is None:
        assert taken == 0
    else:  # 20 steps per layer; with rebalance=7 the steps at positions 21, 28, 35 start an interval
        assert taken == len(routing_caches(m)) * (20 - (3 if rebalance else 0))


def test_training_forwards_are_not_kept_and_config_changes_reset():
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3))
    assert last_routing(m) == [None, None]
    m(torch.randint(1, V, (1, 12)))  # gradients on: nothing kept
    assert last_routing(m) == [None, None]
    with torch.no_grad():
        m(torch.randint(1, V, (1, 12)))
    assert last_routing(m)[0].groups.shape == (1, 12, 4)
    update_config(m, top_k=1)
    assert last_routing(m) == [None, None]


@pytest.mark.parametrize("warm", [False, True])
def test_rebalanced_decode_after_padded_prefill_matches_its_prefill(warm):
    """Left padding stays out of the online potentials in the prefill and in every decode step after it."""
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, rebalance=6, rebalance_warm=warm)).eval()
    x = torch.randint(1, V, (2, 30))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[0, :5] = 0
    with torch.no_grad():
        m(x, attention_mask=mask)
        whole = [r.groups.clone() for r in last_routing(m)]
        cache = output_cache(m(x[:, :18], attention_mask=mask[:, :18], use_cache=True))
        for i in range(18, 30):
            cache = output_cache(m(x[:, i:i + 1], attention_mask=mask[:, :i + 1], **cache_kwargs(m, cache),
                                   use_cache=True))
    for layer, r in enumerate(last_routing(m)):
        torch.testing.assert_close(r.groups[:, 5:], whole[layer][:, 5:])


@pytest.mark.parametrize("rebalance,rate", [(0, 0.0), (5, 0.0), (5, 0.2)])
def test_calls_the_window_covers_defer_routing_and_equal_one_prefill(rebalance, rate):
    """A prompt and decode steps the window covers (Tk - 1 <= w) run as the original attention with their routing
    deferred; the first call past the window routes them in one batch: outputs (left padding included) and routing
    equal one full forward's, and a reader in between sees the routing of every token so far."""
    m = tiny_model("llama")
    base = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=12, top_k=1, rebalance=rebalance, sink_tokens=1,
                                 global_rate=rate)).eval()
    x = torch.randint(1, V, (2, 30))
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the second row
    with torch.no_grad():
        full = m(x, attention_mask=mask).logits
        whole = [r.membership.clone() for r in last_routing(m)]
        globs = [None if r.global_keys is None else r.global_keys.clone() for r in last_routing(m)]
        short = m(x[:, :8], attention_mask=mask[:, :8], use_cache=True)
        assert torch.allclose(short.logits, base(x[:, :8], attention_mask=mask[:, :8]).logits, atol=1e-5)
        assert all(c._pending is not None for c in routing_caches(m))  # deferred: nothing routed yet
        cache, logits = output_cache(short), [short.logits]
        for i in range(8, 30):  # one token at a time: steps up to Tk = 13 stay deferred, then one batch
            out = m(x[:, i:i + 1], attention_mask=mask[:, :i + 1], **cache_kwargs(m, cache), use_cache=True)
            cache = output_cache(out)
            logits.append(out.logits)
            if i == 10:  # a reader mid-way routes what is pending (the same routing the prefill gives)
                assert torch.equal(last_routing(m)[0].membership, whole[0][:, :11])
    torch.testing.assert_close(torch.cat(logits, 1), full, atol=1e-4, rtol=1e-4)
    for layer, r in enumerate(last_routing(m)):
        assert torch.equal(r.membership, whole[layer])
        assert (r.global_keys is None) == (globs[layer] is None)
        assert globs[layer] is None or torch.equal(r.global_keys, globs[layer])
