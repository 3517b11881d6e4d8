"""The LoRA baseline (``focusattn retrofit --method lora``) on the tiny random Llama: it trains through the same
retrofit path, saves PEFT's own format, and that folder reloads with plain ``peft`` to the same logits."""
import json

import pytest
import torch

from focusattn.cli import main

peft = pytest.importorskip("peft")


def _run(tmp_path, tiny_dir, *extra):
    out = tmp_path / "lora"
    args = ["retrofit", "--method", "lora", "--lora-rank", "4", "--model", str(tiny_dir / "model"), "--data",
            str(tiny_dir / "corpus"), "--ood-data", str(tiny_dir / "corpus" / "doc0.txt"), "--out", str(out),
            "--seq-len", "48", "--eval-windows", "2", "--ood-eval-windows", "1", "--checkpoint-every", "1",
            "--lr", "1e-2", *extra]
    return out, main(args)


def test_lora_trains_saves_peft_format_and_reloads(tmp_path, tiny_dir, capsys):
    from transformers import AutoModelForCausalLM

    out, rc = _run(tmp_path, tiny_dir, "--steps", "2")
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    # r (in + out) per projection: q 64->64, k 64->32, v 64->32, o 64->64 (tiny Llama: 4 heads of 16, 2 KV heads)
    per_layer = 4 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64))
    assert s["method"] == "lora" and s["parameters"]["trainable"] == 2 * per_layer
    assert set(s["perplexity"]["after"]) == {"domain", "ood"} and "lora" in s["perplexity"]["after"]["domain"]
    assert s["perplexity"]["after"]["domain"]["lora"] != s["perplexity"]["before"]["domain"]  # it trained
    assert "LoRA r=4" in capsys.readouterr().out
    ad = out / "adapter"
    assert (ad / "adapter_model.safetensors").is_file() and (ad / "adapter_config.json").is_file()
    cfg = json.loads((ad / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and sorted({m.rsplit(".", 1)[1] for m in cfg["target_modules"]}) == [
        "k_proj", "o_proj", "q_proj", "v_proj"]
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]

    # reload with peft alone; the logits equal those of the trained model (reproduced here by loading the
    # checkpoint's LoRA tensors into a fresh wrap) and differ from the base model's
    x = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(1))
    base = AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval()
    with torch.no_grad():
        ref = base(x).logits
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), str(ad)).eval()
    from focusattn.hf.lora import add_lora, load_lora_state
    from focusattn.train.checkpoint import load_checkpoint

    trained = add_lora(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), 4)
    load_lora_state(trained, load_checkpoint(out)["trainable"])
    with torch.no_grad():
        a, b = loaded(x).logits, trained.eval()(x).logits
    assert torch.equal(a, b)
    assert not torch.allclose(a, ref, atol=1e-4)
    # the HTML report reads a LoRA run (no groups, one "lora" mode)
    assert main(["report", str(out), "--html", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "r=4, alpha=8" in html and "a LoRA baseline has no groups" in html


def test_lora_resume_is_exact(tmp_path, tiny_dir):
    from safetensors.torch import load_file

    a, _ = _run(tmp_path / "a", tiny_dir, "--steps", "3")
    b, _ = _run(tmp_path / "b", tiny_dir, "--steps", "1")
    _run(tmp_path / "b", tiny_dir, "--steps", "3", "--resume")
    ta = load_file(str(a / "adapter/adapter_model.safetensors"))
    tb = load_file(str(b / "adapter/adapter_model.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.allclose(ta[k], tb[k], atol=1e-6) for k in ta)


def test_lora_adapter_for_another_model_is_refused(tmp_path, tiny_dir):
    from focusattn.hf.lora import load_lora
    from tests.conftest import tiny_model

    out, rc = _run(tmp_path, tiny_dir, "--steps", "1")
    other = tiny_model("gpt2")  # a different base: refused by name before any tensor is read
    other.config._name_or_path = "gpt2-tiny"
    with pytest.raises(ValueError, match="trained on base model"):
        load_lora(other, out / "adapter")
    with pytest.raises(ValueError, match="does not fit"):
        load_lora(other, out / "adapter", check_base=False)


def test_bad_lora_rank(tmp_path, tiny_dir, capsys):
    out, rc = _run(tmp_path, tiny_dir, "--steps", "1", "--lora-rank", "0")
    assert rc == 2 and "--lora-rank 0" in capsys.readouterr().err and not out.exists()


def test_focus_commands_refuse_a_lora_adapter_by_name(tmp_path, tiny_dir, capsys):
    out, _ = _run(tmp_path, tiny_dir, "--steps", "1")
    capsys.readouterr()
    rc = main(["groups", "--model", str(tiny_dir / "model"), "--adapter", str(out), "--data", str(tiny_dir / "corpus"),
               "--out", str(tmp_path / "g"), "--seq-len", "48"])
    err = capsys.readouterr().err
    assert rc == 2 and "LORA adapter in peft's format" in err and "not a Focus adapter" in err
    assert not (tmp_path / "g").exists()
