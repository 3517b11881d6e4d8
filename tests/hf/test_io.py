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
    with pytest.raises(ValueError, match="adapter.safetensors: sha256"):
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


# ------------------------------------------------------------------------------------------------ verified files
def assert_one_line_error(fn, *match):
    """Run ``fn``; it must raise ValueError whose message is one line containing every string in ``match``."""
    with pytest.raises(ValueError) as ei:
        fn()
    msg = str(ei.value)
    assert "\n" not in msg, msg
    for m in match:
        assert m in msg, msg
    return msg


def test_adapter_records_the_checksum_of_its_tensors(tmp_path):
    import hashlib

    path = fa.save_adapter(_trained(), tmp_path / "ad")
    meta = json.loads((path / "adapter_config.json").read_text())
    assert meta["weights_sha256"] == hashlib.sha256((path / "adapter.safetensors").read_bytes()).hexdigest()
    assert fa.hf.io.verify_adapter(path) == meta


@pytest.mark.parametrize("damage", ["truncate", "flip", "append", "empty", "delete"])
def test_damaged_tensor_file_is_a_one_line_error_naming_it(tmp_path, damage):
    path = fa.save_adapter(_trained(), tmp_path / "ad")
    f = path / "adapter.safetensors"
    data = f.read_bytes()
    if damage == "delete":
        f.unlink()
    else:
        f.write_bytes({"truncate": data[: len(data) // 2], "flip": data[:-9] + bytes([data[-9] ^ 1]) + data[-8:],
                       "append": data + b"\0", "empty": b""}[damage])
    model = tiny_model("llama")
    assert_one_line_error(lambda: fa.load_adapter(model, path), str(f))
    assert not fa.hf.is_composed(model), "a failed load must leave the model as it was"


def _config_variants():
    def edit(fn):
        def apply(d):
            fn(d)
            return json.dumps(d)
        return apply

    return {
        "bad json": (lambda d: "{not json", "corrupt JSON"),
        "truncated json": (lambda d: json.dumps(d)[:40], "corrupt JSON"),
        "not an object": (lambda d: "[1, 2]", "expected a JSON object"),
        "missing key": (edit(lambda d: d.pop("hidden_size")), "missing field(s) ['hidden_size']"),
        "unknown key": (edit(lambda d: d.update(hiden_size=64)), "unknown field(s) ['hiden_size']"),
        "string for int": (edit(lambda d: d.update(hidden_size="64")), "'hidden_size' must be int, got str"),
        "bool for int": (edit(lambda d: d.update(num_layers=True)), "'num_layers' must be int, got bool"),
        "null base": (edit(lambda d: d.update(base_model=None)), "'base_model' must be str"),
        "bad checksum": (edit(lambda d: d.update(weights_sha256="abc")), "64 lowercase hex"),
        "focus_config list": (edit(lambda d: d.update(focus_config=[])), "'focus_config' must be dict"),
        "focus_config unknown": (edit(lambda d: d["focus_config"].update(groups=3)), "corrupt focus_config"),
        "focus_config bad value": (edit(lambda d: d["focus_config"].update(gate="hard")), "corrupt focus_config"),
        "focus_config wrong type": (edit(lambda d: d["focus_config"].update(num_groups="4")), "corrupt focus_config"),
    }


@pytest.mark.parametrize("variant", sorted(_config_variants()))
def test_malformed_adapter_config_is_a_one_line_error_naming_it(tmp_path, variant):
    path = fa.save_adapter(_trained(), tmp_path / "ad")
    cfg = path / "adapter_config.json"
    make, expect = _config_variants()[variant]
    cfg.write_text(make(json.loads(cfg.read_text())))
    model = tiny_model("llama")
    assert_one_line_error(lambda: fa.load_adapter(model, path), str(cfg), expect)
    assert not fa.hf.is_composed(model)


def test_bad_tensors_are_refused_whole(tmp_path):
    """A NaN, or a float where the bool buffer belongs, is an error before any router tensor is copied."""
    import hashlib

    from safetensors.torch import load_file, save_file

    path = fa.save_adapter(_trained(), tmp_path / "ad")
    f, cfg = path / "adapter.safetensors", path / "adapter_config.json"
    good = load_file(str(f))

    def rewrite(tensors):
        save_file(tensors, str(f))
        meta = json.loads(cfg.read_text())
        meta["weights_sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
        cfg.write_text(json.dumps(meta))

    key = next(k for k in good if k.endswith("proj.weight"))
    rewrite({**good, key: good[key].clone().fill_(float("nan"))})
    assert_one_line_error(lambda: fa.load_adapter(tiny_model("llama"), path), "NaN/Inf", key)
    flag = next(k for k in good if k.endswith("offsets_ready"))
    rewrite({**good, flag: good[flag].float()})
    assert_one_line_error(lambda: fa.load_adapter(tiny_model("llama"), path), "wrong dtype", flag)


def test_adapter_without_checksum_still_loads_with_a_warning(tmp_path, caplog):
    m = _trained()
    path = fa.save_adapter(m, tmp_path / "ad")
    meta = json.loads((path / "adapter_config.json").read_text())
    del meta["weights_sha256"]  # as written by focusattn before checksums
    (path / "adapter_config.json").write_text(json.dumps(meta))
    fresh = tiny_model("llama")
    with caplog.at_level("WARNING", logger="focusattn"):
        fa.load_adapter(fresh, path)
    assert "not checksum-verified" in caplog.text
    x = torch.randint(1, V, (1, 20))
    with torch.no_grad():
        assert torch.equal(fresh(x).logits, m(x).logits)


def _enospc(*a, **k):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_while_saving_keeps_the_previous_adapter(tmp_path, monkeypatch):
    """ENOSPC half-way through either file: the tensor file is never half-written, and a new tensor file under the
    old config is caught by the checksum (never a silent mix of two adapters)."""
    import errno

    from focusattn.hf import io

    old = _trained()
    path = fa.save_adapter(old, tmp_path / "ad")
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    new = _trained()
    with torch.no_grad():
        for r in routers(new):
            r.proj.weight.add_(1.0)

    real_save = io.save_file

    def half_then_enospc(tensors, filename):
        real_save(tensors, filename)
        with open(filename, "r+b") as fh:
            fh.truncate(100)  # what a full disk leaves behind
        _enospc()

    monkeypatch.setattr(io, "save_file", half_then_enospc)
    with pytest.raises(OSError) as ei:
        fa.save_adapter(new, path)
    assert ei.value.errno == errno.ENOSPC
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # untouched, no temp file left
    monkeypatch.undo()

    monkeypatch.setattr(type(path), "write_text", _enospc)  # the config write fails after the tensors were replaced
    with pytest.raises(OSError):
        fa.save_adapter(new, path)
    monkeypatch.undo()
    assert sorted(p.name for p in path.iterdir()) == ["adapter.safetensors", "adapter_config.json"]
    assert (path / "adapter_config.json").read_bytes() == before["adapter_config.json"]
    assert_one_line_error(lambda: fa.load_adapter(tiny_model("llama"), path), "sha256", "interrupted save")
