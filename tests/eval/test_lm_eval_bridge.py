"""``focusattn eval`` end to end on a tiny random model and the shipped offline tasks (lm-eval runs for real)."""
import json

import pytest

pytest.importorskip("lm_eval")

from focusattn.cli import main  # noqa: E402
from focusattn.eval.lm_eval_bridge import parse_modes, resolve_adapter  # noqa: E402
from focusattn.eval.tasks import OFFLINE_TASKS  # noqa: E402


def test_eval_offline_side_by_side(tmp_path, tiny_llama_dir, capsys):
    out = tmp_path / "ev"
    rc = main(["eval", "--model", str(tiny_llama_dir / "llama"), "--adapter", str(tiny_llama_dir / "adapter_llama"),
               "--tasks", "offline", "--limit", "3", "--top-k", "soft,1", "--bootstrap-iters", "10", "--batch-size", "8", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "eval.json").read_text())
    assert res["modes"] == ["original", "soft", "top1"] and res["complete"] is True
    assert set(res["results"]) == set(OFFLINE_TASKS)
    assert res["versions"]["lm_eval"] == "0.4.13" and res["command"].startswith("focusattn eval")
    for task, by in res["results"].items():
        assert set(by) == {"original", "soft", "top1"} and res["n_samples"][task] == 3
        metric = "perplexity" if task.startswith("focus_cloze") else "acc"
        for mode in by:
            assert by[mode][metric]["value"] >= 0 and "stderr" in by[mode][metric]
        for mode in ("soft", "top1"):
            d = res["deltas"][task][mode][metric]
            assert d == pytest.approx(by[mode][metric]["value"] - by["original"][metric]["value"])
    assert set(res["breakdowns"]["focus_passkey"]["original"]["by_depth"]) == {"0.1", "0.3", "0.5"}
    md = (out / "eval.md").read_text()
    assert "| focus_passkey | acc | 3 |" in md and "top-1" in md
    assert "wrote" in capsys.readouterr().out


def test_unknown_task_lists_available(tmp_path, tiny_llama_dir, capsys, monkeypatch):
    from lm_eval.tasks import TaskManager

    import focusattn.eval.lm_eval_bridge as bridge
    from focusattn.eval.tasks import OFFLINE_DIR

    # lm-eval's own index of ~14k task configs takes 7-30 s to build here: use ours only
    monkeypatch.setattr(bridge, "task_manager", lambda names: TaskManager(include_path=str(OFFLINE_DIR),
                                                                           include_defaults=False))
    rc = main(["eval", "--model", str(tiny_llama_dir / "llama"), "--tasks", "focus_clozee", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "unknown task(s) 'focus_clozee'" in err and "offline, focus_cloze_short" in err and "did you mean" in err
    assert not (tmp_path / "eval.json").exists()


def test_foreign_adapter_is_refused_before_evaluating(tmp_path, tiny_llama_dir, capsys):
    rc = main(["eval", "--model", str(tiny_llama_dir / "llama"), "--adapter", str(tiny_llama_dir / "adapter_gpt2"),
               "--tasks", "focus_passkey", "--limit", "1", "--out", str(tmp_path)])
    assert rc == 2 and "was made for a gpt2" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


def test_bad_arguments(tmp_path, tiny_llama_dir):
    assert parse_modes("soft,1,2,1") == [None, 1, 2]
    with pytest.raises(ValueError, match="--top-k"):
        parse_modes("soft,0")
    assert resolve_adapter(str(tiny_llama_dir / "adapter_llama")) == tiny_llama_dir / "adapter_llama"
    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text("{}")
    assert resolve_adapter(str(run)) == run / "adapter"  # a retrofit run folder
    with pytest.raises(ValueError, match="no such adapter"):
        resolve_adapter(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="missing adapter_config.json"):
        resolve_adapter(str(tmp_path))
    rc = main(["eval", "--model", str(tiny_llama_dir / "llama"), "--adapter", str(tiny_llama_dir / "adapter_llama"),
               "--tasks", "focus_passkey", "--top-k", "9", "--out", str(tmp_path / "x")])
    assert rc == 2 and not (tmp_path / "x").exists()


def test_interrupted_run_keeps_finished_modes(tmp_path, tiny_llama_dir, monkeypatch):
    import focusattn.eval.lm_eval_bridge as bridge

    real, calls = bridge._evaluate, []

    def flaky(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(bridge, "_evaluate", flaky)
    rc = main(["eval", "--model", str(tiny_llama_dir / "llama"), "--adapter", str(tiny_llama_dir / "adapter_llama"),
               "--tasks", "focus_cloze_short", "--limit", "2", "--top-k", "1", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "eval.json").read_text())
    assert rc == 130 and res["complete"] is False and res["modes"] == ["original"]
    assert res["modes_requested"] == ["original", "top1"]
    assert "Incomplete run" in (tmp_path / "eval.md").read_text()


def test_eval_lora_adapter(tmp_path, tiny_llama_dir):
    """A LoRA (peft) folder from `retrofit --method lora` is evaluated as one mode, against the original."""
    pytest.importorskip("peft")
    import torch

    import focusattn as fa
    from focusattn.hf.lora import add_lora, save_lora

    model, _ = fa.load_model(str(tiny_llama_dir / "llama"))
    lora = add_lora(model, 2)
    with torch.no_grad():  # B starts at zero (LoRA = identity): make the adapter change the model
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    save_lora(lora, tmp_path / "lora")
    out = tmp_path / "ev"
    args = ["eval", "--model", str(tiny_llama_dir / "llama"), "--tasks", "focus_cloze_short", "--limit", "2",
            "--bootstrap-iters", "10", "--batch-size", "8"]
    rc = main(args + ["--adapter", str(tmp_path / "lora"), "--out", str(out)])
    res = json.loads((out / "eval.json").read_text())
    assert rc == 0 and res["modes"] == ["original", "lora"] and res["focus_config"]["lora"]["r"] == 2
    by = res["results"]["focus_cloze_short"]
    assert by["lora"]["perplexity"]["value"] != by["original"]["perplexity"]["value"]  # the adapter is on
    assert res["deltas"]["focus_cloze_short"]["lora"]["perplexity"] == pytest.approx(
        by["lora"]["perplexity"]["value"] - by["original"]["perplexity"]["value"])
    # ... and off for the original: the same numbers as a run without any adapter
    assert main(args + ["--out", str(tmp_path / "base")]) == 0
    base = json.loads((tmp_path / "base" / "eval.json").read_text())["results"]["focus_cloze_short"]["original"]
    assert base["perplexity"]["value"] == pytest.approx(by["original"]["perplexity"]["value"], rel=1e-6)


def test_eval_lazy_adapter(tmp_path, tiny_llama_dir):
    """A Lazy folder from `retrofit --method lazy` is evaluated as one mode, against the original."""
    import focusattn as fa
    from focusattn.hf.lazy import compose_lazy, save_lazy_adapter
    from focusattn.lazy import ElasticConfig

    model, _ = fa.load_model(str(tiny_llama_dir / "llama"))
    compose_lazy(model, ElasticConfig(tau_init=1.5))
    save_lazy_adapter(model, tmp_path / "lazy")
    out = tmp_path / "ev"
    args = ["eval", "--model", str(tiny_llama_dir / "llama"), "--tasks", "focus_cloze_short", "--limit", "2",
            "--bootstrap-iters", "10", "--batch-size", "8"]
    rc = main(args + ["--adapter", str(tmp_path / "lazy"), "--out", str(out)])
    res = json.loads((out / "eval.json").read_text())
    assert rc == 0 and res["modes"] == ["original", "lazy"] and res["focus_config"]["lazy"]["tau_init"] == 1.5
    by = res["results"]["focus_cloze_short"]
    assert by["lazy"]["perplexity"]["value"] != by["original"]["perplexity"]["value"]
