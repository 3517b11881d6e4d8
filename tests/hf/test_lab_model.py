"""The lab GPT as a Hugging Face model: Auto-class round trip with identical logits, generate, the byte tokenizer,
loading through ``focusattn.hf.load_model`` and from a lab run folder."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from focusattn.gpt.config import get_preset
from focusattn.gpt.tokenizer import BOS, encode
from focusattn.hf import load_model
from focusattn.hf.lab_model import LabByteTokenizer, LabGPTConfig, LabGPTForCausalLM


@pytest.fixture(scope="module", params=["standard", "lazy"])
def saved(request, tmp_path_factory):
    mcfg, _ = get_preset("tiny", request.param)
    torch.manual_seed(0)
    model = LabGPTForCausalLM(LabGPTConfig(lab=mcfg.to_dict())).eval()
    with torch.no_grad():  # move tau and the bias table off their initial values so they must round-trip
        for name, p in model.named_parameters():
            if "tau" in name or "bias.table" in name:
                p.normal_(0.5, 0.1)
    out = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(out)
    LabByteTokenizer().save_pretrained(out)
    return model, out


def test_round_trip_identical_logits(saved):
    model, path = saved
    loaded = AutoModelForCausalLM.from_pretrained(path).eval()
    assert isinstance(loaded, LabGPTForCausalLM) and loaded.config.lab == model.config.lab
    assert loaded.gpt.lm_head.weight.data_ptr() == loaded.gpt.tok_emb.weight.data_ptr()  # still tied
    x = torch.cat([torch.tensor([BOS]), encode("Wherefore art thou")])[None]
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)
        assert torch.equal(loaded(x).logits, model.gpt(x)[0])  # the wrapper adds nothing to the lab model


def test_generate_and_tokenizer(saved):
    model, path = saved
    tok = AutoTokenizer.from_pretrained(path)
    assert isinstance(tok, LabByteTokenizer)
    enc = tok("héllo", return_tensors="pt")
    assert enc.input_ids[0].tolist() == [BOS] + list("héllo".encode())
    assert tok.decode(enc.input_ids[0], skip_special_tokens=True) == "héllo"
    out = model.generate(**enc, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, enc.input_ids.shape[1] + 5) and torch.equal(out[0, :enc.input_ids.shape[1]], enc.input_ids[0])
    with torch.no_grad():  # greedy: each new token is the argmax of the model on the prefix
        assert int(model(out[:, :-1]).logits[0, -1].argmax()) == int(out[0, -1])


def test_loss_and_padding(saved):
    """The HF loss is the lab loss; padding never changes a row."""
    model, _ = saved
    x = torch.cat([torch.tensor([BOS]), encode("to be or not")])[None]
    with torch.no_grad():
        out = model(x, labels=x)
        _, lab_loss = model.gpt(x[:, :-1], x[:, 1:])
    assert out.loss.item() == pytest.approx(lab_loss.item(), rel=1e-6)
    # a padded batch (left and right) gives each row the logits of the row alone
    short = x[:, :6]
    pad = torch.full((1, x.shape[1] - 6), BOS)
    batch = torch.cat([torch.cat([pad, short], 1), torch.cat([short, pad], 1), x])
    mask = torch.ones_like(batch)
    mask[0, :pad.shape[1]] = 0
    mask[1, 6:] = 0
    with torch.no_grad():
        lg = model(batch, attention_mask=mask).logits
        alone = model(short).logits[0]
    assert torch.allclose(lg[0, pad.shape[1]:], alone, atol=1e-5) and torch.allclose(lg[1, :6], alone, atol=1e-5)
    assert torch.allclose(lg[2], model(x).logits[0], atol=1e-5) and lg[0, 0].abs().sum() == 0


def test_load_model_and_lab_run(saved, tmp_path):
    model, path = saved
    m, tok = load_model(str(path))
    assert isinstance(m, LabGPTForCausalLM) and isinstance(tok, LabByteTokenizer) and not m.training
    # a lab run folder (config.json + its verified checkpoint) converts to the same model
    import json

    from focusattn.gpt.train import train_lm
    from focusattn.hf.lab_model import export_lab_run
    from focusattn.gpt.data import LMData

    text = encode("ROMEO. But soft, what light through yonder window breaks? " * 20)
    mcfg, tcfg = get_preset("tiny", "standard")
    run = tmp_path / "run"
    train_lm(mcfg, tcfg, data=LMData("toy", text, text), out_dir=run, progress=False)
    exported = export_lab_run(run, tmp_path / "hf")
    again = AutoModelForCausalLM.from_pretrained(exported)
    from focusattn.train.checkpoint import load_checkpoint

    state = load_checkpoint(run)["trainable"]
    assert all(torch.equal(again.gpt.state_dict()[k], v) for k, v in state.items())
    assert json.loads((exported / "config.json").read_text())["model_type"] == "focusattn-lab-gpt"
    # the run folder itself loads too (what `focusattn eval --model RUN` does), and with the Auto classes
    direct, tok = load_model(str(run))
    auto = AutoModelForCausalLM.from_pretrained(run)
    auto_tok = AutoTokenizer.from_pretrained(run)
    assert isinstance(auto, LabGPTForCausalLM) and isinstance(auto_tok, LabByteTokenizer) and not auto.training
    assert AutoModelForCausalLM.from_pretrained(run, dtype=torch.bfloat16).gpt.tok_emb.weight.dtype == torch.bfloat16
    x = tok("soft", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(direct(x).logits, again(x).logits)
        assert torch.equal(auto(auto_tok("soft", return_tensors="pt").input_ids).logits, again(x).logits)


def test_focusattn_eval_loads_a_lab_model(saved, tmp_path):
    """``focusattn eval --model PATH`` on a saved lab model (offline lm-eval tasks, batched: padding)."""
    pytest.importorskip("lm_eval")
    import json

    from focusattn.cli import main

    model, _ = saved
    # bytes are long: the offline tasks need more than the tiny preset's 4 x 32 RoPE positions
    lab = {**model.config.lab, "max_seq_len": 1024}
    path = tmp_path / "lab"
    LabGPTForCausalLM(LabGPTConfig(lab=lab)).save_pretrained(path)
    LabByteTokenizer().save_pretrained(path)
    out = tmp_path / "ev"
    rc = main(["eval", "--model", str(path), "--tasks", "offline", "--limit", "2", "--bootstrap-iters", "10",
               "--batch-size", "4", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "eval.json").read_text())
    assert res["complete"] and res["modes"] == ["original"] and res["results"]
