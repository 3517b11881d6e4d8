"""scripts/partition_imitation.py: the trained classifier, written into a FocusRouter, serves exactly its groups."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from focusattn.focus.config import FocusConfig
from focusattn.focus.router import FocusRouter

_scripts = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(_scripts))  # the script imports partition_oracle beside it
spec = importlib.util.spec_from_file_location("partition_imitation", _scripts / "partition_imitation.py")
pi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pi)


@pytest.mark.parametrize("hidden", [0, 16])
def test_the_imitator_as_a_router_serves_the_classifiers_argmax(hidden):
    torch.manual_seed(0)
    cfg = FocusConfig(num_groups=4, group_dim=8, top_k=1, global_rate=0.1)
    router = FocusRouter(12, cfg).eval()
    net = torch.nn.Linear(12, 4) if not hidden else torch.nn.Sequential(
        torch.nn.Linear(12, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 4))
    mu, sd = torch.randn(12), torch.rand(12) + 0.5
    served = pi._as_router(net, mu, sd, router, cfg, hidden)
    h = torch.randn(1, 50, 12) * 2
    with torch.no_grad():
        want = net((h[0] - mu) / sd).argmax(-1)
        got = served.served(h, 1)
    assert torch.equal(got.groups[0].argmax(-1), want)
    assert torch.equal(got.membership[0].float().argmax(-1), want)  # no cap: the served top-1 is the argmax
    assert torch.equal(got.global_keys, router.served(h, 1).global_keys)  # the router's global-key scorer kept


def test_a_router_narrower_than_its_groups_cannot_hold_the_imitator():
    cfg = FocusConfig(num_groups=8, group_dim=4, top_k=1)
    with pytest.raises(SystemExit, match="group_dim 4 < num_groups 8"):
        pi._as_router(torch.nn.Linear(6, 8), torch.zeros(6), torch.ones(6), FocusRouter(6, cfg), cfg, 0)


def test_select_layers_takes_the_donor_only_where_it_keeps_more_as_served_within_the_budget():
    spec2 = importlib.util.spec_from_file_location("select_layers", _scripts / "select_layers.py")
    sl = importlib.util.module_from_spec(spec2)
    spec2.loader.exec_module(sl)

    def row(layer, imit, imit_budget):
        return {"layer": layer, "eval_router_capped": 0.3, "eval_router_capped_budget": 0.15,
                "eval_imitator_served_capped": imit, "eval_imitator_served_capped_budget": imit_budget}

    doc = {"layers": [row(0, 0.2, 0.15), row(1, 0.4, 0.14), row(2, 0.4, 0.2), row(3, 0.31, 0.157)]}
    assert sl.chosen(doc, 1.05) == [1, 3]  # layer 0 keeps less, layer 2 buys its mass with budget
    assert sl.chosen(doc, 1.5) == [1, 2, 3]
