"""One sequence's decode step takes the lean path (``focus.attend.attend_one_token``): the ``gather`` branch's keys
and fused call without the validation, masks and dispatch around them (issue 23). Exact against the general path
and the dense reference (the gathered and the masked call; global keys as host positions, dense heads, sinks, top-1
and top-2), None wherever it does not apply, and end to end a prefill plus decode steps (one token and several at a time) equals one prefill."""
import pytest
import torch

import focusattn as fa
from focusattn.focus.attend import attend, attend_one_token
from focusattn.focus.router import Routing
from focusattn.hf import last_routing, routers, routing_caches
from focusattn.hf.kv import cache_kwargs, output_cache
from focusattn.kernels import dispatch
from focusattn.kernels.common import sink_key_mask
from focusattn.kernels.dispatch import BreakEvens
from focusattn.kernels.group_index import GroupIndex
from focusattn.kernels.reference import dense_focus_attention
from tests.conftest import assert_close, focus_case, tiny_model, token_ids

SPARSE = {"cpu": BreakEvens()}  # every decode step gathers
MASKED = {"cpu": BreakEvens(decode={1: 1 << 20, 2: 1 << 20})}  # every decode step takes one masked pass


def _case(seed, top_k, tk=40, glob_rate=0.2):
    q, k, v, member = focus_case(seed, 1, 6, 3, 1, tk, 4, top_k)
    g = torch.Generator().manual_seed(seed + 1)
    glob = torch.rand(1, tk, generator=g) < glob_rate
    return q, k, v, member, glob


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("dense_kv", [(), (1,), (0, 2)])
@pytest.mark.parametrize("glob_rate,sink", [(0.0, 0), (0.0, 1), (0.2, 1), (0.3, 0)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("table", ["gather", "decode-masked"])
def test_the_lean_step_equals_attend_and_the_reference(top_k, dense_kv, glob_rate, sink, seed, table):
    q, k, v, member, glob = _case(seed, top_k, glob_rate=glob_rate)
    cfg = fa.FocusConfig(num_groups=4, window=3, top_k=top_k, sink_tokens=sink)
    routing = Routing(groups=member.float(), membership=member, global_keys=glob if glob_rate else None)
    positions = glob[0].nonzero()[:, 0].tolist() if glob_rate else None
    dispatch.PICKS.clear()
    with torch.no_grad(), dispatch.using(SPARSE if table == "gather" else MASKED):
        want = attend(q, k, v, routing, cfg, group_index=GroupIndex(member), dense_kv=dense_kv)
        got = attend_one_token(q, k, v, GroupIndex(member), cfg, global_positions=positions, dense_kv=dense_kv)
    assert got is not None and dispatch.PICKS[table] >= 2 and len(dispatch.PICKS) == 1
    assert_close(got, want, atol=1e-5, name="lean step vs attend")
    sinks = sink_key_mask(40, sink, None, None)
    if glob_rate:
        sinks = glob if sinks is None else sinks | glob
    ref = dense_focus_attention(q, k, v, member, 3, sink=sinks if sinks is not None else 0)
    causal = dense_focus_attention(q, k, v, member, 40)
    qh = [2 * h + j for h in dense_kv for j in range(2)]
    ref[:, qh] = causal[:, qh]
    assert_close(got, ref, atol=1e-5, name="lean step vs reference")


def test_the_lean_step_declines_what_it_does_not_serve():
    """None (the caller runs the general path) for: a call the window covers (the causal branch), a batch, a
    gradient, another backend, query and key roles, every head dense."""
    q, k, v, member, _ = _case(0, 1)
    cfg = fa.FocusConfig(num_groups=4, window=3, top_k=1)
    idx = GroupIndex(member)
    with torch.no_grad():
        assert attend_one_token(q, k, v, idx, fa.FocusConfig(num_groups=4, window=40, top_k=1)) is None
        assert attend_one_token(q, k, v, idx, cfg) is not None  # 40 keys: the packaged tables' masked pass
        with dispatch.using(SPARSE):
            assert attend_one_token(q, k, v, idx, cfg) is not None
            assert attend_one_token(q, k, v, idx, fa.FocusConfig(num_groups=4, window=3, top_k=1,
                                                                 backend="decomposed")) is None
            assert attend_one_token(q, k, v, idx, fa.FocusConfig(num_groups=4, window=3, top_k=1,
                                                                 key_top_k=2)) is None
            assert attend_one_token(q, k, v, idx, cfg, dense_kv=(0, 1, 2)) is None
            qb, kb, vb, mb = focus_case(0, 2, 6, 3, 1, 40, 4, 1)
            assert attend_one_token(qb, kb, vb, GroupIndex(mb), cfg) is None
    with dispatch.using(SPARSE):
        assert attend_one_token(q.requires_grad_(True), k, v, idx, cfg) is None


def _served_model():
    """A tiny model with global keys (a threshold learned from one batch), a dense head and a sink."""
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, global_rate=0.2, dense_heads=((0, 1),)))
    for r in routers(m):
        r.train()
    with torch.no_grad():
        m(token_ids(2, 40, seed=9))
    return m.eval()


@pytest.mark.parametrize("table", [SPARSE, MASKED])
def test_decode_steps_take_the_lean_step_and_equal_one_prefill(table, monkeypatch):
    """Steps of one token take the lean path (counted), a step of three tokens the general one; every step's logits
    equal one prefill's, and the host list of global keys equals the routing's mask after the steps."""
    import focusattn.hf.attention_fn as af

    taken = []
    real = af.attend_one_token
    monkeypatch.setattr(af, "attend_one_token", lambda *a, **kw: taken.append(real(*a, **kw)) or taken[-1])
    m = _served_model()
    x = token_ids(t=48, seed=3)
    with torch.no_grad(), dispatch.using(table):
        whole = m(x).logits
        out = m(x[:, :20], use_cache=True)
        steps, cache, i = [out.logits], output_cache(out), 20
        while i < 48:
            n = 3 if i == 30 else 1
            out = m(x[:, i:i + n], **cache_kwargs(m, cache), use_cache=True)
            steps.append(out.logits)
            cache, i = output_cache(out), i + n
    assert_close(torch.cat(steps, 1), whole, atol=1e-4, name="prefill + steps vs one prefill")
    layers = len(routing_caches(m))
    assert sum(t is not None for t in taken) == layers * 25  # the 25 one-token steps, every layer
    for c, r in zip(routing_caches(m), last_routing(m)):
        assert c.global_positions() == r.global_keys[0].nonzero()[:, 0].tolist()
    assert any(r.global_keys.any() for r in last_routing(m))
