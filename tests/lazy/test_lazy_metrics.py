"""Attention diagnostics on hand-built weight matrices."""
import pytest
import torch

from focusattn.lazy.metrics import (attention_report, empty_rows, sink_mass, sink_share, sparsity, surviving_mass,
                                   uniform_sink_mass)


def _uniform(t):
    return torch.ones(t, t).tril() / torch.arange(1, t + 1)[:, None]


def test_uniform_softmax():
    a = _uniform(4)[None, None]
    assert sparsity(a).item() == 0.0
    assert surviving_mass(a).item() == pytest.approx(1.0)
    assert sink_mass(a).item() == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert sink_mass(a).item() == pytest.approx(uniform_sink_mass(4))


def test_full_sink_and_zeros_per_head():
    t = 4
    sink = torch.zeros(t, t)
    sink[:, 0] = 1.0  # everything on the first token
    half = _uniform(t) * 0.5
    half[3] = 0.0  # one all-zero row
    a = torch.stack([sink, half])[None]
    assert sparsity(a).tolist() == pytest.approx([6 / 10, 4 / 10])  # 10 causal pairs
    assert surviving_mass(a).tolist() == pytest.approx([1.0, (0.5 * 3) / 4])
    assert sink_mass(a).tolist() == pytest.approx([1.0, (0.25 + 0.5 / 3 + 0.0) / 3])


def test_sink_share_compares_like_with_like():
    t = 4
    sink = torch.zeros(t, t)
    sink[:, 0] = 1.0
    half = _uniform(t) * 0.5  # an Elastic-like head: rows keep half their mass, spread uniformly
    half[3] = 0.0  # one row keeps nothing
    a = torch.stack([sink, half, _uniform(t)])[None]
    # absolute weight halves, the share does not: the half head allocates like the uniform one
    assert sink_mass(a)[1].item() < sink_mass(a)[2].item()
    assert sink_share(a).tolist() == pytest.approx([1.0, (1 / 2 + 1 / 3) / 2, uniform_sink_mass(t)])
    assert empty_rows(a).tolist() == pytest.approx([0.0, 1 / 4, 0.0])
    assert sink_share(_uniform(t)[None, None]).item() == pytest.approx(sink_mass(_uniform(t)[None, None]).item())


def test_report_layout():
    w = [_uniform(5)[None, None].expand(2, 3, 5, 5)] * 2
    r = attention_report(w)
    assert len(r["per_head"]["sink_mass"]) == 2 and len(r["per_head"]["sink_mass"][0]) == 3
    assert r["mean"]["surviving_mass"] == pytest.approx(1.0)
    assert r["uniform_sink_mass"] == pytest.approx(uniform_sink_mass(5))
    assert r["mean"]["sink_share"] == pytest.approx(r["mean"]["sink_mass"]) and r["mean"]["empty_rows"] == 0.0
    assert len(r["per_head"]["sink_share"][1]) == 3


def test_bad_shape():
    with pytest.raises(ValueError, match=r"\[B, H, T, T\]"):
        sparsity(torch.zeros(2, 3, 4))
