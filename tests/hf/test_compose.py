import pytest
import torch

import focusattn as fa
from focusattn.hf import routers, update_config

from tests.conftest import V, tiny_configs, tiny_model

ARCHS = sorted(tiny_configs())


def _ids(b=2, t=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, V, (b, t), generator=g)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("top_k", [None, 1])
def test_identity_when_window_covers_sequence(arch, top_k):
    m = tiny_model(arch)
    x = _ids()
    with torch.no_grad():
        ref = m(x).logits
    fa.compose(m, fa.FocusConfig(num_groups=4, window=10_000, top_k=top_k, backend="dense"))
    assert m.config._attn_implementation == "focus"
    with torch.no_grad():
        out = m(x).logits
    assert (out - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_only_routers_train_and_weights_stay_bit_identical(arch):
    m = tiny_model(arch)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    fa.compose(m, fa.FocusConfig(num_groups=4, window=4))
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all("focus_router" in n for n in trainable)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    for r in routers(m):
        r.train()
    x = _ids()
    for _ in range(2):
        m(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    for n, p in m.named_parameters():
        if n in before:
            assert torch.equal(p, before[n]), n
    changed = [r.proj.weight for r in routers(m)]
    assert all(w.abs().sum() > 0 for w in changed)
    fa.unload(m)
    assert {n for n, _ in m.named_parameters()} == set(before)
    assert all(p.requires_grad for p in m.parameters())
    fa.compose(m, fa.FocusConfig(num_groups=4, window=4))
    with pytest.warns(DeprecationWarning, match="unload"):  # the old name still works
        fa.decompose(m)
    assert {n for n, _ in m.named_parameters()} == set(before)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_sparse_mask_changes_outputs_and_router_gets_gradient(arch):
    m = tiny_model(arch)
    x = _ids(t=48)
    with torch.no_grad():
        ref = m(x).logits
    fa.compose(m, fa.FocusConfig(num_groups=4, window=4))
    out = m(x).logits
    assert (out - ref).abs().max() > 1e-3  # distant pairs really are gated
    out.sum().backward()
    assert all(r.proj.weight.grad is not None and r.proj.weight.grad.abs().sum() > 0 for r in routers(m))


def test_causal_routing_never_sees_the_future():
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, routing="causal"))
    for r in routers(m):  # learn offsets from one batch, then freeze (eval)
        r.train()
    with torch.no_grad():
        m(_ids(seed=5))
    m.eval()
    x = _ids(t=40)
    y = x.clone()
    y[:, 25:] = torch.randint(1, V, y[:, 25:].shape)
    for k in (None, 1, 2):
        fa.set_top_k(m, k, backend="dense")
        with torch.no_grad():
            a, b = m(x).logits, m(y).logits
        assert torch.allclose(a[:, :25], b[:, :25], atol=1e-5)


def test_sequence_routing_leaks_future_information():
    """The paper's sequence-wide Sinkhorn: later tokens change earlier tokens' groups (why causal is the default)."""
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, routing="sequence"))
    x = _ids(t=40)
    y = x.clone()
    y[:, 25:] = torch.randint(1, V, y[:, 25:].shape)
    with torch.no_grad():
        a, b = m(x).logits, m(y).logits
    assert (a[:, :25] - b[:, :25]).abs().max() > 1e-6


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("top_k", [None, 2])
def test_left_padding_matches_unpadded(arch, top_k):
    m = tiny_model(arch)
    fa.compose(m, fa.FocusConfig(num_groups=4, window=5, top_k=top_k, backend="dense"))
    m.eval()
    x = _ids(b=1, t=30)
    pad = 6
    xp = torch.cat([torch.zeros(1, pad, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(x)], 1)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        ref = m(x).logits
        out = m(xp, attention_mask=mask, position_ids=pos).logits[:, pad:]
    assert (out - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("top_k", [1, 2])
def test_greedy_generation_with_cache_equals_full_recompute(top_k):
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=top_k, backend="dense"))
    m.eval()
    x = _ids(b=1, t=20)
    with torch.no_grad():
        gen = m.generate(x, max_new_tokens=12, do_sample=False, pad_token_id=0)
        seq = x
        for _ in range(12):  # no cache: every step re-runs the whole prefix
            nxt = m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert torch.equal(gen, seq)


def test_decoding_requires_causal_routing():
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, routing="sequence", top_k=1, backend="dense"))
    with pytest.raises(ValueError, match="routing='causal'"):
        m.generate(_ids(b=1, t=10), max_new_tokens=2, do_sample=False, pad_token_id=0)


def test_set_top_k_validation_and_errors():
    m = tiny_model("llama")
    with pytest.raises(ValueError, match="no Focus routers"):
        fa.set_top_k(m, 1)
    fa.compose(m, fa.FocusConfig(num_groups=4))
    with pytest.raises(ValueError, match="top_k"):
        fa.set_top_k(m, 5)
    with pytest.raises(ValueError, match="already has Focus"):
        fa.compose(m, fa.FocusConfig())
    with pytest.raises(ValueError, match="cannot change"):
        update_config(m, num_groups=2)
    assert fa.set_top_k(m, 3).top_k == 3


def test_unsupported_architecture_names_supported_ones():
    import transformers as tr

    m = tr.AutoModelForCausalLM.from_config(tr.BloomConfig(n_layer=1, hidden_size=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="supports .*llama"):
        fa.compose(m, fa.FocusConfig())


def _confident(m):
    """Routers with large, well-separated scores: no near-ties, so 1e-6 kernel differences cannot flip a group."""
    for r in routers(m):
        with torch.no_grad():
            r.proj.weight.mul_(50)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "gemma2"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_fast_path_matches_dense_hard_mask_in_model(arch, top_k):
    m = tiny_model(arch)
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=top_k, backend="decomposed"))
    _confident(m)
    m.eval()
    x = _ids(b=2, t=40)
    mask = torch.ones_like(x)
    mask[1, :7] = 0  # left padding in the second row
    with torch.no_grad():
        fast = m(x, attention_mask=mask).logits
        fa.set_top_k(m, top_k, backend="dense")
        dense = m(x, attention_mask=mask).logits
    keep = mask.bool()
    assert (fast - dense)[keep].abs().max().item() <= 1e-4


@pytest.mark.parametrize("top_k", [1, 2])
def test_greedy_generation_fast_path_equals_dense_path(top_k):
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=top_k, backend="decomposed"))
    _confident(m)
    m.eval()
    x = _ids(b=1, t=24)
    with torch.no_grad():
        fast = m.generate(x, max_new_tokens=16, do_sample=False, pad_token_id=0)
        fa.set_top_k(m, top_k, backend="dense")
        dense = m.generate(x, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(fast, dense)


def test_activation_checkpointing_gives_the_same_router_gradients():
    from focusattn.train.retrofit import _checkpointing

    grads, offsets = [], []
    for ckpt in (False, True):
        m = tiny_model("llama")
        fa.compose(m, fa.FocusConfig(num_groups=4, window=4, offset_momentum=0.5))
        if ckpt:
            _checkpointing(m, True)
            m.train()
        for r in routers(m):
            r.train()
        for seed in (1, 2):  # second step: offsets already initialised, EMA update happens
            x = _ids(t=40, seed=seed)
            loss = m(x, labels=x).loss
            (loss + 0.1 * torch.stack([r.balance for r in routers(m)]).mean()).backward()  # as retrofit does
        grads.append(torch.cat([p.grad.flatten() for p in fa.hf.router_parameters(m)]))
        offsets.append(torch.cat([r.offsets for r in routers(m)]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert torch.allclose(offsets[0], offsets[1], atol=1e-6)  # recomputation did not update the EMA twice


def test_sink_tokens_in_model_generation_fast_equals_dense():
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, backend="decomposed", sink_tokens=1))
    for r in routers(m):
        with torch.no_grad():
            r.proj.weight.mul_(50)
    m.eval()
    x = torch.randint(1, V, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fast = m.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)
        fa.set_top_k(m, 1, backend="dense")
        dense = m.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)
        seq = x
        for _ in range(10):
            seq = torch.cat([seq, m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(fast, dense) and torch.equal(dense, seq)


def test_original_attention_block_is_the_original_model():
    """The distillation teacher: inside ``original_attention`` a composed model (sparse, window far below the
    sequence) gives the original logits; Focus comes back after the block, even when it raised."""
    from focusattn.hf.compose import original_attention

    m = tiny_model("llama")
    x = _ids()
    with torch.no_grad():
        ref = m(x).logits
    fa.compose(m, fa.FocusConfig(num_groups=4, window=2, top_k=1))
    with torch.no_grad(), original_attention(m):
        assert (m(x).logits - ref).abs().max().item() <= 1e-5
    with torch.no_grad():
        assert (m(x).logits - ref).abs().max().item() > 1e-3
    with pytest.raises(RuntimeError), original_attention(m):
        raise RuntimeError("boom")
    assert m.config._attn_implementation == "focus"


def test_beam_search_and_assisted_generation_are_refused_before_any_forward():
    """The routing cache follows a KV cache that only grows: generate's modes that reorder (beam search) or crop
    (assisted generation) it raise a clear error instead of returning a silently wrong answer; unload lifts it."""
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, backend="dense"))
    calls = []
    hook = m.register_forward_pre_hook(lambda *a: calls.append(1))
    x = _ids(b=1, t=12)
    kw = dict(max_new_tokens=3, pad_token_id=0)
    with torch.no_grad():
        with pytest.raises(ValueError, match="routing cache does not follow beam-search reorders") as e:
            m.generate(x, num_beams=3, do_sample=False, **kw)
        assert "BEAM_SEARCH" in str(e.value).upper()
        with pytest.raises(ValueError, match="Focus routers are attached"):
            m.generate(x, num_beams=2, do_sample=True, **kw)
        with pytest.raises(ValueError, match="Focus routers are attached"):
            m.generate(x, prompt_lookup_num_tokens=2, do_sample=False, **kw)
        assert calls == []  # refused before the first forward
        assert m.generate(x, do_sample=False, **kw).shape == (1, 15)  # greedy still runs
        hook.remove()
        fa.unload(m)
        assert "_supported_generation_modes" not in m.__dict__
        assert m.generate(x, num_beams=3, do_sample=False, **kw).shape[0] == 1


@pytest.mark.parametrize("top_k", [None, 1])
def test_reordered_kv_cache_rows_are_refused(top_k):
    """A loop that gathers the cache's rows itself (what beam search does) is caught at the next decode step; the
    same batch decoded in order, and rows that are equal, are not."""
    from transformers import DynamicCache

    from focusattn.hf.kv import cache_kwargs

    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=top_k, backend="dense"))
    x = _ids(b=3, t=12)
    nxt = torch.tensor([[5], [6], [7]])
    with torch.no_grad():
        for order, ok in (([0, 1, 2], True), ([1, 0, 2], False)):
            cache = DynamicCache(config=m.config)
            m(x, **cache_kwargs(m, cache), use_cache=True)
            cache.reorder_cache(torch.tensor(order))
            if ok:
                m(nxt, **cache_kwargs(m, cache), use_cache=True)
            else:
                with pytest.raises(RuntimeError, match="batch rows were reordered"):
                    m(nxt, **cache_kwargs(m, cache), use_cache=True)
        same = x[:1].expand(3, -1)  # identical rows: any order is the same routing
        cache = DynamicCache(config=m.config)
        m(same, **cache_kwargs(m, cache), use_cache=True)
        cache.reorder_cache(torch.tensor([2, 0, 1]))
        m(nxt, **cache_kwargs(m, cache), use_cache=True)
