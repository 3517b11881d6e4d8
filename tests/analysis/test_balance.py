"""``routing_stats``: the balance the kernels pay for, from the groups as served."""
import torch

import focusattn as fa
from focusattn.analysis.balance import routing_stats
from focusattn.focus import router as R
from focusattn.hf import routers, update_config
from tests.conftest import V, tiny_model


def test_largest_share_is_the_served_groups_with_the_cap(monkeypatch):
    monkeypatch.setattr(R, "CAPACITY_BLOCK", 8)
    torch.manual_seed(0)
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, capacity=1.25)).eval()
    with torch.no_grad():
        for r in routers(m):
            r.offsets[0] += 10.0  # one group everyone wants
    x = torch.randint(1, V, (1, 200))
    with torch.no_grad():
        m(x)
    capped = routing_stats(m, 200)
    update_config(m, capacity=0.0)
    with torch.no_grad():
        m(x)
    plain = routing_stats(m, 200)
    assert plain["max_largest_share"] > 0.6
    assert capped["max_largest_share"] <= 1.25 / 4 + 8 / 200
    assert capped["max_group_cost_vs_balanced"] < plain["max_group_cost_vs_balanced"]
