import json

import pytest
import torch

import focusattn as fa
from focusattn.hf import routers

from tests.conftest import V, tiny_model


def _trained(arch="llama"):
    m = tiny_model(arch)
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3))
    for r in routers(m):
        r.train()
        with torch.no_grad():
            r.proj.weight.normal_()
    m(torch.randint(1, V, (1, 30)))  # sets causal offsets
    m.eval()
    return m


def test_adapter_round_trip_reproduces_logits(tmp_path):
    m = _trained()
    x = torch.randint(1, V, (2, 30))
    with torch.no_grad():
        ref = m(x).logits
    path = fa.save_adapter(m, tmp_path / "ad")
    assert sorted(p.name for p in path.iterdir()) == ["adapter.safetensors", "adapter_config.json"]
    meta = json.loads((path / "adapter_config.json").read_text())
    assert meta["model_type"] == "llama" and meta["focus_config"]["num_groups"] == 4
    fresh = tiny_model("llama")
    fa.load_adapter(fresh, path)
    with torch.no_grad():
        assert torch.allclose(fresh(x).logits, ref, atol=1e-6)


def test_adapter_errors(tmp_path):
    m = _trained()
    path = fa.save_adapter(m, tmp_path / "ad")
    with pytest.raises(ValueError, match="gpt2"):
        fa.load_adapter(tiny_model("gpt2"), path)  # another architecture
    other = tiny_model("llama")
    other.config._name_or_path = "someone/else"
    m.config._name_or_path = "me/base"
    path2 = fa.save_adapter(m, tmp_path / "ad2")
    with pytest.raises(ValueError, match="base model"):
        fa.load_adapter(other, path2)
    with pytest.raises(ValueError, match="missing adapter_config.json"):
        fa.load_adapter(tiny_model("llama"), tmp_path)
    (path / "adapter.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read"):
        fa.load_adapter(tiny_model("llama"), path)
    cfg = json.loads((path2 / "adapter_config.json").read_text())
    cfg["focus_config"]["num_groups"] = 3  # shapes no longer fit
    (path2 / "adapter_config.json").write_text(json.dumps(cfg))
    bad = tiny_model("llama")
    bad.config._name_or_path = "me/base"
    with pytest.raises(ValueError, match="does not fit"):
        fa.load_adapter(bad, path2)


def test_corrupt_config(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        fa.load_adapter(tiny_model("llama"), tmp_path)
