"""Probes in place of a composed model's attention: capture runs the original attention; masked runs exact dense
attention under a rule; the recall measurement reads every layer through capture."""
import numpy as np
import pytest
import torch

import focusattn as fa
from focusattn.eval.recall import measure_recall
from focusattn.hf import probe
from focusattn.hf.baselines import restore, sliding_sink
from focusattn.kernels import recall as R
from tests.conftest import assert_close, tiny_configs, tiny_model

ARCHS = list(tiny_configs())


def _pair(arch, **cfg):
    base = tiny_model(arch)
    focus = fa.compose(tiny_model(arch), fa.FocusConfig(num_groups=4, group_dim=8, window=3, top_k=1, **cfg))
    return base, focus.eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_capture_is_the_original_model_and_sees_every_layer(arch):
    base, focus = _pair(arch)
    x = torch.randint(0, 90, (2, 24))
    seen = []

    def fn(layer, module, h, q, k, scale, softcap):
        seen.append((layer, tuple(h.shape), tuple(q.shape), k.shape[2]))

    with torch.no_grad(), probe.capture(focus, fn):
        got = focus(x).logits
    assert_close(got, base(x).logits, atol=1e-4, name=f"{arch} logits")
    assert [s[0] for s in seen] == list(range(base.config.num_hidden_layers))
    assert all(s[1][:2] == (2, 24) and s[2][2] == 24 and s[3] == 24 for s in seen)
    with torch.no_grad():  # the context restored Focus attention
        assert_close(focus(x).logits, focus(x).logits, name="focus after")
    assert focus.config._attn_implementation == "focus"


def test_masked_rule_spans_original_and_sliding_sink():
    base, focus = _pair("llama", sink_tokens=1)
    x = torch.randint(0, 90, (1, 30))
    everything = lambda *a: (lambda r0, r1, p=None: torch.ones(1, r1 - r0, 30, dtype=torch.bool))  # noqa: E731
    nothing = lambda *a: (lambda r0, r1, p=None: torch.zeros(1, r1 - r0, 30, dtype=torch.bool))  # noqa: E731
    with torch.no_grad():
        with probe.masked(focus, everything):
            assert_close(focus(x).logits, base(x).logits, atol=1e-4, name="keep all")
        with probe.masked(focus, nothing):
            got = focus(x).logits
        want = sliding_sink(base, 3, 1)(x).logits
        restore(base)
    assert_close(got, want, atol=1e-4, name="keep none = window + sink")


def test_oracle_at_full_budget_is_the_original_and_kmeans_runs():
    base, focus = _pair("llama", sink_tokens=1)
    x = torch.randint(0, 90, (1, 30))
    with torch.no_grad():
        with probe.masked(focus, probe.oracle_rule(4)):  # top-4 of 4 groups: every pair shared
            assert_close(focus(x).logits, base(x).logits, atol=1e-4, name="oracle at top-K")
        with probe.masked(focus, probe.oracle_rule(1)):
            oracle = focus(x).logits
        with probe.masked(focus, probe.kmeans_rule(1)):
            km = focus(x).logits
        c = focus.config
        d = c.num_key_value_heads * getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
        fixed = {i: torch.randn(3, d) for i in range(c.num_hidden_layers)}  # centroids fitted elsewhere
        with probe.masked(focus, probe.kmeans_rule(1, fixed)):
            km_fixed = focus(x).logits
    assert torch.isfinite(oracle).all() and torch.isfinite(km).all() and torch.isfinite(km_fixed).all()
    assert not torch.allclose(oracle, base(x).logits, atol=1e-4)


def test_probes_refuse_decode_steps_and_plain_models():
    base, focus = _pair("llama")
    with pytest.raises(ValueError, match="no Focus routers"):
        with probe.capture(base, lambda *a: None):
            pass
    x = torch.randint(0, 90, (1, 8))
    with torch.no_grad(), probe.capture(focus, lambda *a: None):
        out = focus(x, use_cache=True)
        with pytest.raises(ValueError, match="prefill"):
            focus(x[:, :1], cache=out.past_key_values, use_cache=True)


def test_measure_recall_on_a_tiny_model():
    base, focus = _pair("llama", sink_tokens=1)
    other = fa.compose(tiny_model("llama"), fa.FocusConfig(num_groups=4, group_dim=8, window=3, routing="random"))
    windows = np.random.default_rng(0).integers(0, 90, (2, 40))
    doc = measure_recall(focus, windows, top_ks=(1, 2), others={"random": other.eval()},
                         sliding={"sliding@top1": 10}, progress=False)
    assert doc["windows"] == 2 and doc["T"] == 40 and len(doc["layers"]) == 2
    masks = doc["overall"]["masks"]
    for name in ("top1", "top2", "oracle@top1", "oracle@top2", "random@top1", "kmeans@top2", "sliding@top1"):
        assert 0 <= masks[name]["dropped_distant"] <= 1, name
    # the oracle keeps as many keys as the mask it matches, and never drops more
    for k in (1, 2):
        assert abs(masks[f"oracle@top{k}"]["keys_per_query"] - masks[f"top{k}"]["keys_per_query"]) < 1e-9
        assert masks[f"oracle@top{k}"]["dropped_distant"] <= masks[f"top{k}"]["dropped_distant"] + 1e-9
    assert masks["top2"]["keys_per_query"] >= masks["top1"]["keys_per_query"]
    assert abs(sum(doc["overall"]["share"].values()) - 1) < 1e-6
    assert masks["top1"]["vs_oracle"] >= 1 - 1e-9
