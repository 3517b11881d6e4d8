"""Dense heads (FocusConfig.dense_heads): chosen key/value heads serve full causal attention, the layer's other heads
the routed mask. Exact against the references head by head (outputs, gradients, GQA, padding, decode), end to end in
a composed model (prefill = decode = generate = recompute; every head dense = the original model), validated, saved
with the adapter, and counted in the kept-pairs and recall accounting."""
import dataclasses

import pytest
import torch

import focusattn as fa
from focusattn._errors import InputError
from focusattn.focus.attend import attend
from focusattn.focus.router import Routing
from focusattn.hf import last_routing
from focusattn.hf.kv import cache_kwargs, output_cache
from focusattn.kernels.common import sink_key_mask
from focusattn.kernels.reference import dense_focus_attention, focus_allowed
from tests.conftest import assert_close, assert_round_trip, composed, focus_case, tiny_model, token_ids

CFG = fa.FocusConfig(num_groups=4, window=3, top_k=1, dense_heads=((0, 1), (1, 0)))


def _ids(b=1, t=40, seed=1):
    return token_ids(b, t, seed)


def _model(cfg=CFG, arch="llama"):
    return composed(cfg, arch)


@pytest.mark.parametrize("backend", ["dense", "decomposed", "auto"])
@pytest.mark.parametrize("tq", [24, 1, 5])
@pytest.mark.parametrize("dense_kv", [(1,), (0, 2), (0, 1)])
def test_split_heads_equal_the_references_head_by_head(backend, tq, dense_kv):
    """GQA (6 query heads on 3 KV heads): the dense KV heads' query heads equal causal attention, the others the
    routed reference; gradients too, with padding. Prefill (tq = 24) and decode steps take different splits."""
    q, k, v, member = focus_case(0, 2, 6, 3, tq, 24, 4, 1)
    kpm = torch.ones(2, 24, dtype=torch.bool)
    kpm[1, :3] = False
    for x in (q, k, v):
        x.requires_grad_(True)
    cfg = fa.FocusConfig(num_groups=4, window=3, top_k=1, backend=backend, sink_tokens=1)
    routing = Routing(groups=member.float(), membership=member)
    out = attend(q, k, v, routing, cfg, key_padding_mask=kpm, dense_kv=dense_kv)
    causal = dense_focus_attention(q, k, v, member, 24, key_padding_mask=kpm)
    routed = dense_focus_attention(q, k, v, member, 3, sink=1, key_padding_mask=kpm)
    qh = [2 * h + j for h in dense_kv for j in range(2)]
    want = routed.clone()
    want[:, qh] = causal[:, qh]
    assert_close(out, want, atol=1e-5, name="split heads")
    assert not torch.allclose(routed[:, qh], causal[:, qh], atol=1e-4)  # the routed mask drops pairs here
    g = torch.randn_like(out)
    got = torch.autograd.grad((out * g).sum(), (q, k, v))
    ref = torch.autograd.grad((want * g).sum(), (q, k, v))
    for a, b, n in zip(got, ref, "qkv"):
        assert_close(a, b, atol=1e-4, name=f"d{n}")


@pytest.mark.parametrize("dense_kv", [(1,), (0, 2)])
def test_a_decode_step_at_inference_calls_the_fused_op_for_its_dense_heads(dense_kv, monkeypatch):
    """One new query without padding or gradient: the dense heads' rows come from the fused op directly (not
    through routing, validation and dispatch), equal to causal attention; the routed heads to the reference."""
    import sys

    A = sys.modules[attend.__module__]  # the module (the package re-exports the function under its name)
    calls = []
    real = A.fused_fwd
    monkeypatch.setattr(A, "fused_fwd", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, member = focus_case(0, 2, 6, 3, 1, 24, 4, 1)
    cfg = fa.FocusConfig(num_groups=4, window=3, top_k=1, sink_tokens=1)
    with torch.no_grad():
        out = attend(q, k, v, Routing(groups=member.float(), membership=member), cfg, dense_kv=dense_kv)
    causal = dense_focus_attention(q, k, v, member, 24)
    want = dense_focus_attention(q, k, v, member, 3, sink=1)
    qh = [2 * h + j for h in dense_kv for j in range(2)]
    want[:, qh] = causal[:, qh]
    assert_close(out, want, atol=1e-5, name="decode step")
    assert len(calls) == len(dense_kv)  # one call per run of adjacent dense heads (here: each head its own run)


def test_every_head_dense_is_the_original_model():
    for arch in ("llama", "gemma2"):  # gemma2: logit softcapping and an interleaved sliding window
        base = tiny_model(arch)
        m = _model(dataclasses.replace(CFG, dense_heads=((0, 0), (0, 1), (1, 0), (1, 1))), arch)
        x = _ids(b=2)
        with torch.no_grad():
            assert_close(m(x).logits, base(x).logits, atol=1e-4, name=arch)


def test_served_model_equals_dense_backend_and_differs_from_all_routed():
    m = _model()
    x = _ids()
    with torch.no_grad():
        fast = m(x).logits
        fa.set_top_k(m, 1, backend="dense")
        dense = m(x).logits
        fa.hf.update_config(m, dense_heads=())
        routed = m(x).logits
    assert_close(fast, dense, atol=1e-5)
    assert not torch.allclose(fast, routed, atol=1e-4)


def test_decode_steps_and_generate_equal_one_prefill():
    m = _model()
    x = _ids(b=2)
    with torch.no_grad():
        whole = m(x).logits
        out = m(x[:, :20], use_cache=True)
        steps, cache = [out.logits], output_cache(out)
        for i in range(20, 40):
            out = m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True)
            steps.append(out.logits)
            cache = output_cache(out)
        assert_close(torch.cat(steps, 1), whole, atol=1e-4)
        y = _ids(t=24)
        gen = m.generate(y, max_new_tokens=10, do_sample=False, pad_token_id=0)
        seq = y
        for _ in range(10):
            seq = torch.cat([seq, m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(gen, seq)
    assert all(r.membership is not None for r in last_routing(m))  # the router still runs: its routed heads


@pytest.mark.parametrize("heads,match", [
    ([[1]], "dense_heads"), ([[0, 1], [0, 1]], "dense_heads"), ([[-1, 0]], "dense_heads"), (3, "dense_heads"),
    ([[0, True]], "dense_heads"),
])
def test_config_refuses_malformed_heads(heads, match):
    with pytest.raises(InputError, match=match):
        fa.FocusConfig(dense_heads=heads)


def test_config_normalises_json_lists_and_round_trips():
    cfg = fa.FocusConfig(dense_heads=[[3, 1], [0, 2]])
    assert cfg.dense_heads == ((0, 2), (3, 1)) and cfg.dense_kv_heads(3) == (1,) and cfg.dense_kv_heads(1) == ()
    assert fa.FocusConfig.from_dict(cfg.to_dict()) == cfg


def test_compose_and_update_refuse_heads_the_model_lacks():
    with pytest.raises(ValueError, match=r"dense_heads \[\(2, 0\)\] out of range: allowed .* layer in 0..1"):
        fa.compose(tiny_model("llama"), dataclasses.replace(CFG, dense_heads=((2, 0),)))
    m = _model()
    with pytest.raises(ValueError, match=r"kv_head in 0..1"):
        fa.hf.update_config(m, dense_heads=((0, 2),))
    assert fa.hf.focus_config(m).dense_heads == CFG.dense_heads  # the old config stays


def test_adapter_round_trips_dense_heads(tmp_path):
    loaded = assert_round_trip(_model(), tmp_path / "a")
    assert fa.hf.focus_config(loaded).dense_heads == CFG.dense_heads


def test_pairs_kept_counts_dense_heads_whole():
    from focusattn.eval.longctx import pairs_kept

    x = _ids(t=64)[0].numpy()
    m = _model()  # one of two KV heads dense in each layer
    half = pairs_kept(m, x)
    shares = [focus_allowed(r.membership, 3, 64, sink_key_mask(64, 1)).sum().item() / (64 * 65 / 2)
              for r in last_routing(m)]
    assert half == pytest.approx(sum(0.5 + 0.5 * s for s in shares) / 2, abs=1e-9) and max(shares) < 0.9


def test_recall_keeps_every_pair_of_dense_heads():
    from focusattn.eval.recall import measure_recall

    m = _model()
    w = _ids(b=2, t=48).numpy()
    rec = measure_recall(m, w, top_ks=(1,), kmeans=True, oracle=True, progress=False)
    for lay, (dkv,) in zip(rec["layers"], ((1,), (0,))):
        for name in ("top1", "oracle@top1", "kmeans@top1"):
            per_head = lay["masks"][name]["dropped_distant_per_head"]
            assert per_head[2 * dkv] == pytest.approx(0.0, abs=1e-9) and per_head[2 * dkv + 1] == 0
    fa.hf.update_config(m, dense_heads=())
    routed = measure_recall(m, w, top_ks=(1,), kmeans=False, oracle=False, progress=False)
    assert routed["overall"]["masks"]["top1"]["dropped_distant"] > rec["overall"]["masks"]["top1"]["dropped_distant"]


def test_oracle_probe_with_every_head_dense_is_the_original():
    from focusattn.hf.probe import masked, oracle_rule

    base = tiny_model("llama")
    m = _model(dataclasses.replace(CFG, dense_heads=((0, 0), (0, 1), (1, 0), (1, 1))))
    x = _ids()
    with torch.no_grad(), masked(m, oracle_rule(1)):
        got = m(x).logits
    with torch.no_grad():
        assert_close(got, base(x).logits, atol=1e-4)


def test_copy_scores_scored_heads_and_the_spec_parser():
    """Scores are attention shares per (layer, KV head) for each kind; the top-n of several kinds are distinct pairs
    adding up to the counts; the spec parser names the flag on bad input. (That the scores find the copying heads
    is tested on the real model.)"""
    from focusattn.hf.heads import copy_scores, induction_heads, induction_scores, parse_dense_heads, scored_heads

    m = _model(dataclasses.replace(CFG, dense_heads=()))
    s = copy_scores(m, half=24, seeds=(0,))
    assert set(s) == {"induction", "duplicate"}
    for v in s.values():
        assert v.shape == (2, 2) and bool(((v >= 0) & (v <= 1)).all())
    assert torch.equal(induction_scores(m, half=24, seeds=(0,)), s["induction"])
    assert len(induction_heads(m, 3, half=24, seeds=(0,))) == 3
    both = scored_heads(m, {"induction": 2, "duplicate": 2}, half=24, seeds=(0,))
    assert len(set(both)) == 4 and set(induction_heads(m, 2, half=24, seeds=(0,))) <= set(both)
    assert scored_heads(m, {"induction": 2, "duplicate": 2}, scores=s) == both  # scored once, reused
    with pytest.raises(ValueError, match="induction:9: allowed at most 4 heads"):
        induction_heads(m, 9, half=24, seeds=(0,))
    assert parse_dense_heads("17:1,18:2") == ((17, 1), (18, 2)) and parse_dense_heads("induction:6") == {"induction": 6}
    assert parse_dense_heads("induction:6+duplicate:3") == {"induction": 6, "duplicate": 3}
    assert parse_dense_heads("none") == ()
    for bad in ("17", "a:b", "induction:x", "induction:-1", "-1:0", "", "induction:2+induction:3",
                "induction:2+copy:1", "duplicate:2+"):
        with pytest.raises(InputError, match="dense_heads.*allowed 'none'"):
            parse_dense_heads(bad)


def test_duo_baseline_keeps_its_dense_heads_whole_and_windows_the_rest():
    """DuoAttention-style baseline: the listed KV heads see every causal pair, the others window + sink; every head
    dense is the original model; its window for a budget accounts for the dense share."""
    from focusattn.hf.baselines import pairs_kept_sliding, restore, sliding_sink, window_for_budget

    m = tiny_model("llama")
    x = _ids(t=50)
    with torch.no_grad():
        ref = m(x).logits
        sliding_sink(m, window=5, sinks=1, dense_heads=((0, 0), (0, 1), (1, 0), (1, 1)))
        all_dense = m(x).logits
        sliding_sink(m, window=5, sinks=1, dense_heads=((1, 0),))
        duo = m(x).logits
        sliding_sink(m, window=5, sinks=1)
        narrow = m(x).logits
        restore(m)
    assert_close(all_dense, ref, atol=1e-4)
    assert (duo - narrow).abs().max() > 1e-3 and (duo - ref).abs().max() > 1e-3
    w = window_for_budget(64, 0.6, 1, dense=0.25)
    assert 0.25 + 0.75 * pairs_kept_sliding(64, w) >= 0.6 > 0.25 + 0.75 * pairs_kept_sliding(64, w - 1)


def test_recall_of_a_window_beside_dense_heads():
    from focusattn.kernels.recall import layer_recall

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 40, 8, generator=g), torch.randn(1, 2, 40, 8, generator=g)
    dense = torch.tensor([False, False, True, True])
    s = layer_recall(q, k, {}, window=3, sink=1, windows={"sliding": 6, "duo": 6}, dense=dense,
                     dense_windows=("duo",))
    assert torch.allclose(s["kept"]["duo"][2:], s["mass"]["distant"][2:])
    assert torch.equal(s["kept"]["duo"][:2], s["kept"]["sliding"][:2])
    assert (s["kept"]["sliding"][2:] < s["mass"]["distant"][2:]).all()
