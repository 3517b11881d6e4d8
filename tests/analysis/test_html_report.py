"""``focusattn report RUN_DIR... --html``: every section present, self-contained, and rendered by headless Chromium."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from focusattn.analysis.html import SECTIONS
from focusattn.cli import main

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _eval_json():
    r = {"original": {"acc": {"value": 0.5, "stderr": 0.1}}, "soft": {"acc": {"value": 0.55, "stderr": 0.1}},
         "top1": {"acc": {"value": 0.4, "stderr": 0.1}}}
    c = {"original": {"perplexity": {"value": 30.0, "stderr": 5.0}, "acc": {"value": 0.3, "stderr": 0.1}},
         "soft": {"perplexity": {"value": 31.0, "stderr": 5.0}, "acc": {"value": 0.3, "stderr": 0.1}},
         "top1": {"perplexity": {"value": 35.0, "stderr": None}, "acc": {"value": 0.25, "stderr": 0.1}}}
    res = {"focus_passkey": r, "focus_cloze_long": c}
    deltas = {t: {m: {k: v["value"] - by["original"][k]["value"] for k, v in by[m].items()} for m in ("soft", "top1")}
              for t, by in res.items()}
    return {"command": "focusattn eval --tasks offline", "model": "smollm2-135m", "adapter": "run/adapter",
            "focus_config": None, "tasks": ["offline"], "limit": 20, "num_fewshot": None,
            "modes": ["original", "soft", "top1"], "results": res, "deltas": deltas,
            "n_samples": {"focus_passkey": 20, "focus_cloze_long": 20},
            "breakdowns": {"focus_passkey": {"original": {"by_depth": {"0.1": {"acc": 1.0, "n": 4}}}}},
            "seconds": {"original": 1.0}, "versions": {"lm_eval": "0.4.13", "focusattn": "0.1.0"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A full run (summary, metrics with per-layer collapse shares, eval, sinks) and a bare one (summary only)."""
    tmp_path = tmp_path_factory.mktemp("runs")
    full, bare = tmp_path / "full", tmp_path / "bare"
    for d in (full, bare):
        d.mkdir()
        shutil.copy(RESULTS / "retrofit_default.json", d / "summary.json")
    shutil.copy(RESULTS / "sink_probe.json", full / "sink_probe.json")
    n_layers = len(json.loads((full / "summary.json").read_text())["groups"])
    with open(full / "metrics.jsonl", "w") as f:
        for step in range(1, 6):
            f.write(json.dumps({"step": step, "loss": 4 - 0.1 * step, "lr": 1e-3, "grad_norm": 1.0,
                                "tokens_per_s": 100.0, "largest_group_share": [0.125 + 0.02 * step * (i % 3)
                                                                               for i in range(n_layers)]}) + "\n")
    (full / "eval.json").write_text(json.dumps(_eval_json()))
    return full, bare


@pytest.fixture(scope="module")
def page(runs):
    """The comparison page of both runs, rendered once for the module."""
    full, bare = runs
    out = full.parent / "cmp.html"
    assert main(["report", str(full), str(bare), "--html", str(out)]) == 0
    return out


def test_html_has_every_section_and_is_self_contained(runs, page, capsys):
    full, bare = runs
    page = page.read_text()
    for sid, title in SECTIONS:
        assert f'<section id="{sid}">' in page and title in page
    assert page.count("data:image/png;base64,") >= 9  # perplexity, pareto, 2 x groups, training, collapse, ...
    assert "http://" not in page and "https://" not in page and "<script" not in page  # nothing fetched
    assert "bare</b>: collapse curves not recorded" in page
    assert f"produce it with <code>focusattn eval --adapter {bare}/adapter" in page  # names the command
    assert "focus_passkey" in page and "(-0.1)" in page
    # one run, default output path
    assert main(["report", str(bare)]) == 0 and (bare / "report.html").exists()


def test_run_folder_missing_files_names_them(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc = main(["report", str(tmp_path / "empty"), "--html", str(tmp_path / "x.html")])
    err = capsys.readouterr().err
    assert rc == 2 and "missing summary.json" in err and "focusattn retrofit --out" in err and "focusattn eval" in err
    assert not (tmp_path / "x.html").exists()
    assert main(["report", "--html", str(tmp_path / "x.html")]) == 2
    assert main(["report", str(tmp_path / "nope"), "--html", str(tmp_path / "x.html")]) == 2


def _chromium():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium not installed (apt-get install chromium; "
                                                "`make setup` does it where apt is available)")
def test_html_renders_in_headless_chromium(page, tmp_path):
    out = page
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for sid, title in SECTIONS:
        assert f'id="{sid}"' in dom and title in dom, sid
    assert dom.count("<img") >= 9
    shot = tmp_path / "shot.png"
    subprocess.run(flags + ["--window-size=1200,2400", f"--screenshot={shot}", out.as_uri()], capture_output=True,
                   timeout=120)
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[0] == 2400 and img.shape[1] == 1200
    non_white = (img < 0.9).any(axis=-1).mean()
    assert non_white > 0.02 and img.std() > 0.05  # text and plots, not a blank page
