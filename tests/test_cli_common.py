"""The shared flag checks (``focusattn._cli_common``): every subcommand, given each bad value of a flag it shares,
exits with one line naming the flag and writes nothing, before any model is loaded; every flag has help text;
every computing command takes ``--threads``."""
import argparse
import os
from pathlib import Path

import pytest

from focusattn._cli_common import HelpFormatter, check_long_eval, check_names, check_top_ks, ints, model_positions
from focusattn._errors import InputError, cli_message
from focusattn.cli import build_parser, main

K = 4  # groups of the tiny adapter


@pytest.fixture(scope="module")
def setup(tiny_dir, tmp_path_factory):
    """The tiny local model (256 positions), a K=4 Focus adapter for it, and a file to put an --out inside."""
    import focusattn as fa

    d = tmp_path_factory.mktemp("checks")
    model, _ = fa.load_model(str(tiny_dir / "model"))
    fa.compose(model, fa.FocusConfig(num_groups=K, group_dim=8, window=8))
    fa.save_adapter(model, d / "adapter")
    (d / "file").write_text("x")
    return {"model": str(tiny_dir / "model"), "data": str(tiny_dir / "corpus"), "adapter": str(d / "adapter"),
            "blocked": str(d / "file" / "out")}


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# (command and its good arguments, {flag: bad value}); {m}, {d}, {a} are the model, corpus and adapter
COMMANDS = {
    "retrofit": (["retrofit", "--model", "{m}", "--data", "{d}", "--seq-len", "32"],
                 {"--window": "-1", "--seq-len": "100000", "--threads": "0", "--groups": "0",
                  "--eval-top-k": "9", "--sink-tokens": "-1"}),
    "sinks": (["sinks", "--model", "{m}", "--data", "{d}", "--seq-len", "32"],
              {"--window": "-1", "--seq-len": "100000", "--threads": "0", "--groups": "0", "--sink-tokens": "-1",
               "--eval-windows": "0"}),
    "groups": (["groups", "--model", "{m}", "--adapter", "{a}", "--data", "{d}", "--seq-len", "32"],
               {"--top-k": str(K + 1), "--seq-len": "100000", "--threads": "0", "--adapter": "no-such-adapter"}),
    "eval": (["eval", "--model", "{m}", "--adapter", "{a}"], {"--top-k": f"soft,{K + 1}", "--threads": "0"}),
    "long-eval": (["long-eval", "--model", "{m}", "--adapter", "{a}", "--lengths", "64"],
                  {"--lengths": "100000", "--top-k": str(K + 1), "--threads": "0"}),
    "bench-model": (["bench-model", "--model", "{m}", "--adapter", "{a}", "--lengths", "64"],
                    {"--lengths": "100000", "--top-k": str(K + 1), "--threads": "0", "--repeats": "0"}),
    "bench": (["bench", "--quick"], {"--window": "-1", "--lengths": "0", "--top-k": "0", "--threads": "0",
                                    "--repeats": "0"}),
    "train-lm": (["train-lm", "--attention", "standard"], {"--threads": "0"}),
    "compare": (["compare"], {"--threads": "0"}),
    "bench-lazy": (["bench-lazy"], {"--threads": "0"}),
    "report": (["report"], {}),
}
CASES = [(cmd, flag, bad) for cmd, (_, bad_values) in COMMANDS.items()
         for flag, bad in [*bad_values.items(), ("--out", None)]]


@pytest.mark.parametrize("cmd,flag,bad", CASES, ids=[f"{c}{f}" for c, f, _ in CASES])
def test_each_bad_value_is_one_line_naming_the_flag_and_nothing_is_written(setup, tmp_path, capsys, cmd, flag, bad):
    base, _ = COMMANDS[cmd]
    argv = [x.format(m=setup["model"], d=setup["data"], a=setup["adapter"]) for x in base]
    out = str(tmp_path / "out")
    if flag == "--out":
        out = setup["blocked"]  # inside a file: cannot be created
    else:
        argv += [flag, bad]
    capsys.readouterr()
    before = _listing(Path(setup["blocked"]).parent)
    rc = main(argv + ["--out", out])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"focusattn {cmd}: error: {flag} "), err
    assert not (tmp_path / "out").exists() and _listing(tmp_path) == []
    assert _listing(Path(setup["blocked"]).parent) == before


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (a folder no file can be created in)")
def test_out_where_permission_bits_allow_but_a_write_fails(capsys):
    """/proc passes os.access for root; the probe file finds what the write would."""
    rc = main(["bench", "--quick", "--out", "/proc/nope"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("focusattn bench: error: --out /proc/nope: cannot be written"), err


def test_shipped_adapter_top_k_above_its_groups(capsys, tmp_path):
    """The issue's case: K=8 read from the shipped adapter's config, refused before the model is even resolved."""
    rc = main(["groups", "--adapter", "smollm2-135m-focus-k8", "--top-k", "9", "--model", str(tmp_path / "none"),
               "--out", str(tmp_path / "g")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--top-k 9: top-k 9 out of range (adapter smollm2-135m-focus-k8 has K=8 groups)" in err, err
    assert not (tmp_path / "g").exists()


def test_model_positions_read_from_the_config(setup, tmp_path):
    import json

    import transformers as tr

    from focusattn.gpt.config import get_preset

    assert model_positions(setup["model"]) == 256
    tr.GPT2Config(n_positions=96).save_pretrained(tmp_path / "gpt2")  # GPT-2 says n_positions
    assert model_positions(str(tmp_path / "gpt2")) == 96
    mcfg, tcfg = get_preset("tiny", "standard")
    (tmp_path / "run").mkdir()  # a lab run's record: its RoPE cache bounds the positions
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": mcfg.to_dict(), "train": tcfg.to_dict()}))
    assert model_positions(str(tmp_path / "run")) == mcfg.seq_cache
    with pytest.raises(InputError, match="no such file"):
        model_positions(str(tmp_path / "missing"))


def test_parsing_names_the_flag():
    assert ints(["1024,2048", "4096"], "lengths") == (1024, 2048, 4096) and ints("", "top_k") == ()
    with pytest.raises(InputError) as e:
        ints("1,x", "layers")
    assert cli_message(e.value).startswith("--layers 1,x: 'x' is not an integer")
    check_top_ks("soft,1,4", "top_k", 4, soft=True)
    with pytest.raises(InputError, match="'soft' is not a top-k"):
        check_top_ks("soft,1", "top_k", 4)
    with pytest.raises(InputError, match="out of range"):
        check_top_ks(["0"], "top_k", None)


def test_long_eval_variants_are_refused_not_dropped():
    from focusattn.eval.longctx import variant_names

    assert variant_names((1, 2), ("sliding",)) == ["original", "soft", "top1", "top2", "sliding@top1",
                                                   "sliding@top2"]
    assert check_long_eval(top_ks=["1", "2"], baselines="sliding,random", variants="") == (("sliding", "random"),
                                                                                          None)
    assert check_long_eval(top_ks=["1"], baselines="random", variants="original,random@top1")[1] == (
        "original", "random@top1")
    with pytest.raises(InputError) as e:
        check_long_eval(top_ks=["1", "2"], baselines="sliding,random,untrained", variants="original,top9")
    msg = cli_message(e.value)
    assert msg.startswith("--variants original,top9: unknown top9: allowed original, soft, top1, top2,"), msg
    with pytest.raises(InputError, match="unknown soft"):  # --no-soft: there is no soft row to keep
        check_long_eval(top_ks=["1"], baselines="", variants="soft", soft=False)
    with pytest.raises(InputError, match="--baselines|baselines"):
        check_long_eval(top_ks=["1"], baselines="sliding,lsh", variants="")
    with pytest.raises(InputError, match="unknown b"):
        check_names("a,b", "x", ["a"])


# ------------------------------------------------------------------------------------------------ help
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("cmd", sorted(_subparsers()))
def test_every_flag_has_help(cmd):
    p = _subparsers()[cmd]
    missing = [a.option_strings[0] if a.option_strings else a.dest for a in p._actions
               if not a.help and not isinstance(a, argparse._HelpAction)]
    assert not missing, f"{cmd}: no help text for {missing}"


COMPUTING = ["retrofit", "sinks", "groups", "eval", "long-eval", "bench", "bench-model", "train-lm", "compare",
             "bench-lazy"]


@pytest.mark.parametrize("cmd", COMPUTING)
def test_computing_commands_take_threads(cmd):
    assert any(a.dest == "threads" for a in _subparsers()[cmd]._actions)


@pytest.mark.parametrize("cmd", ["long-eval", "bench-model"])
def test_serving_commands_pass_every_override_to_the_pair_loader(cmd, monkeypatch):
    """``long-eval`` and ``bench-model`` take the same serve-time overrides and hand each one, by its load_pair
    name, to the run they start (None where the flag is absent: the adapter's own)."""
    import inspect

    from focusattn._cli_common import SERVE_OVERRIDES, serve_overrides
    from focusattn.hf.pair import load_pair

    assert set(SERVE_OVERRIDES) <= set(inspect.signature(load_pair).parameters)
    argv = [cmd, "--adapter", "a", "--out", "o", "--rebalance", "128", "--no-rebalance-warm", "--capacity", "1.5",
            "--window", "512", "--budget", "0.12", "--key-scores", "means", "--rank-block", "64", "--rank-own", "2",
            "--union-block", "64", "--min-keys", "128", "--dense-heads", "none"]
    a = build_parser().parse_args(argv)
    assert serve_overrides(a) == {"rebalance": 128, "rebalance_warm": False, "capacity": 1.5, "window": 512,
                                  "budget": 0.12, "key_scores": "means", "rank_block": 64,
                                  "rank_own": 2, "union_block": 64, "min_keys": 128, "dense_heads": "none"}
    got = {}
    target = "focusattn.eval.longctx.run_long_eval" if cmd == "long-eval" else "focusattn.bench.model.run_model_bench"
    monkeypatch.setattr(target, lambda *x, **k: got.update(k) or {"results": []})
    monkeypatch.setattr("focusattn.bench.report.render_model_markdown", lambda doc: "")
    a.func(a)
    assert {k: got[k] for k in SERVE_OVERRIDES} == serve_overrides(a)
    bare = build_parser().parse_args([cmd, "--adapter", "a", "--out", "o"])
    assert set(serve_overrides(bare).values()) == {None}


def test_each_default_is_printed_once():
    text = _subparsers()["retrofit"].format_help()
    block = text[text.rindex("--eval-top-k"):text.rindex("--checkpoint-every")]  # the options, not the usage
    assert block.count("default") == 1, block
    from focusattn.train.retrofit import RetrofitConfig

    assert f"optimizer steps (default: {RetrofitConfig().steps})" in " ".join(text.split())  # informative: kept
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--n", type=int, default=3, help="n")
    p.add_argument("--s", default="", help="s")
    p.add_argument("--f", action="store_true", help="f")
    h = " ".join(p.format_help().split())
    assert "n (default: 3)" in h and "s (default" not in h and "f (default" not in h


def test_threads_set_torch_threads(setup, tmp_path, monkeypatch):
    import torch

    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr("focusattn.analysis.cli.run_sink_probe", lambda *a, **k: {"stop": True})
    monkeypatch.setattr("focusattn.analysis.cli.sinks_markdown", lambda res: "")
    assert main(["sinks", "--model", setup["model"], "--seq-len", "32", "--threads", "1",
                 "--out", str(tmp_path / "s")]) == 0
    assert seen == [1]


def test_no_probe_file_is_left_behind(tmp_path):
    from focusattn._io import check_writable

    check_writable(tmp_path / "a" / "b")
    check_writable(tmp_path)
    assert os.listdir(tmp_path) == []
