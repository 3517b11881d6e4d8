"""``focusattn retrofit --method lazy`` (and ``lazy+lora``) on the tiny random Llama: the same training loop,
checkpoints and evaluation as Focus; the adapter reloads by the Focus entry point to the same logits."""
import json

import pytest
import torch

import focusattn as fa
from focusattn.cli import main


def _run(tmp_path, tiny_dir, *extra, method="lazy"):
    out = tmp_path / "lazy"
    args = ["retrofit", "--method", method, "--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"),
            "--ood-data", str(tiny_dir / "corpus" / "doc0.txt"), "--out", str(out), "--seq-len", "48",
            "--eval-windows", "2", "--ood-eval-windows", "1", "--checkpoint-every", "1", "--lr", "5e-2",
            "--tau-init", "0.5", *extra]
    return out, main(args)


def test_lazy_retrofit_trains_tau_saves_and_reloads(tmp_path, tiny_dir, capsys):
    from transformers import AutoModelForCausalLM

    out, rc = _run(tmp_path, tiny_dir, "--steps", "2", "--lazy-bias", "--bias-window", "16")
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["method"] == "lazy" and set(s["perplexity"]["after"]["domain"]) == {"lazy"}
    tau = [t for layer in s["lazy"]["tau"] for t in layer]
    assert any(abs(t - 0.5) > 1e-4 for t in tau)  # trained
    att = s["lazy"]["attention"]
    assert 0 <= att["mean"]["sparsity"] < 1 and len(att["per_layer"]["sink_share"]) == 2
    assert att["uniform_sink_mass"] > 0 and "sink_share_far" not in att["mean"]  # 48 tokens: no far queries
    assert "Elastic-Softmax" in capsys.readouterr().out
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("tau_mean" in r for r in recs if "loss" in r)
    m = AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval()
    fa.load_adapter(m, out / "adapter")
    from focusattn.hf.lazy import taus

    assert torch.allclose(torch.tensor(taus(m)).flatten(), torch.tensor(tau), atol=1e-6)


def test_lazy_retrofit_resume_is_exact(tmp_path, tiny_dir):
    from safetensors.torch import load_file

    a, _ = _run(tmp_path / "a", tiny_dir, "--steps", "3")
    b, _ = _run(tmp_path / "b", tiny_dir, "--steps", "1")
    _run(tmp_path / "b", tiny_dir, "--steps", "3", "--resume")
    ta, tb = load_file(str(a / "adapter/adapter.safetensors")), load_file(str(b / "adapter/adapter.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.allclose(ta[k], tb[k], atol=1e-6) for k in ta)


def test_lazy_lora_retrofit(tmp_path, tiny_dir):
    pytest.importorskip("peft")
    out, rc = _run(tmp_path, tiny_dir, "--steps", "2", "--lora-rank", "2", method="lazy+lora")
    assert rc == 0
    meta = json.loads((out / "adapter/adapter_config.json").read_text())
    assert meta["adapter_type"] == "lazy" and meta["lora"]["rank"] == 2
    assert meta["lora"]["projections"] == ["q_proj", "k_proj"]


def test_nothing_to_train_is_a_one_line_error(tmp_path, tiny_dir, capsys):
    out, rc = _run(tmp_path, tiny_dir, "--steps", "1", "--freeze-tau")
    err = capsys.readouterr().err
    assert rc == 2 and "nothing to train" in err and not out.exists()


def test_focus_commands_refuse_a_lazy_adapter(tmp_path, tiny_dir, capsys):
    out, _ = _run(tmp_path, tiny_dir, "--steps", "1")
    capsys.readouterr()
    rc = main(["groups", "--model", str(tiny_dir / "model"), "--adapter", str(out), "--data", str(tiny_dir / "corpus"),
               "--out", str(tmp_path / "g"), "--seq-len", "48"])
    err = capsys.readouterr().err
    assert rc == 2 and "Lazy (Elastic-Softmax) adapter" in err and not (tmp_path / "g").exists()
