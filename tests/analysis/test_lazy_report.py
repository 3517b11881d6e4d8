"""The Lazy claims table computes its verdicts from the runs (nothing typed by hand)."""
import json

from focusattn.analysis.lazy_report import render_lab_claims, render_lazy_pretrained, render_lazy_results


def _run(loss, sink_layers, sparsity, seed):
    u = 0.01
    return {"seed": seed, "val_loss": loss, "val_loss_2x": loss + 0.1, "val_loss_4x": loss + 0.3, "val_acc": 0.5,
            "sink_share": u * sum(sink_layers) / len(sink_layers), "sparsity": sparsity, "surviving_mass": 0.5,
            "empty_rows": 0.0, "per_layer": {"sink_share": [u * x for x in sink_layers]},
            "per_head": {"sink_share": [[u * x] * 2 for x in sink_layers]}}


def _doc(lazy_sink):
    return {"command": "focusattn compare ...", "preset": "lab-sink", "model": {"block_size": 512},
            "equal_compute": {"tokens_per_run": 100}, "uniform_sink_mass": 0.01,
            "runs": {"standard": [_run(1.80 + 0.01 * s, [5.0, 1.0], 0.0, s) for s in range(3)],
                     "lazy": [_run(1.79 + 0.01 * s, lazy_sink, 0.6, s) for s in range(3)]}}


def test_verdicts_follow_the_numbers():
    md = render_lab_claims(_doc([1.2, 0.8]))
    assert "reproduced in 3/3 seeds" in md and "| up to 59.58%" in md
    assert "within the seed spread" in md
    md = render_lab_claims(_doc([6.0, 1.0]))
    assert "not reproduced (0/3 seeds under the bar)" in md
    assert "partly" in render_lab_claims(_doc([2.5, 1.0]))


def _point(name, tau, ppl, share):
    att = {"uniform_sink_mass": 0.01, "uniform_far": 0.001, "mean": {"sparsity": 0.5, "surviving_mass": 0.9,
                                                                     "sink_share": share, "zero_tiles": 0.0},
           "per_layer": {"sink_share": [share, share]}}
    return {"point": name, "tau_mean": tau, "rows": [{"T": 512, "ppl_domain": ppl, "attention": att}]}


def test_pretrained_target_is_computed():
    point = _point
    probe = {"command": "c", "model": "m", "ppl_windows": 1, "stat_windows": 1, "corpora": {"domain": "d"},
             "points": [point("original", 0, 10.0, 0.3), point("tau=1", 1, 10.1, 0.015)]}
    md = render_lazy_pretrained(probe)
    assert "met by tau=1 at 512" in md and "would not pay on this model" in md  # the probe's tiles are all 0
    probe["points"][1] = point("tau=1", 1, 12.0, 0.3)
    assert "met by no point" in render_lazy_pretrained(probe)


def test_trained_probes_from_several_files_are_merged_once(tmp_path):
    """Each ``lazy_probe_trained*.json`` adds its adapters' rows; an adapter probed twice is shown once."""
    base = {"command": "c0", "model": "m", "ppl_windows": 1, "stat_windows": 1, "corpora": {"domain": "d"}}
    probe = {**base, "points": [_point("original", 0, 10.0, 0.3), _point("tau=1", 1, 10.1, 0.2)]}
    one = {**base, "command": "c1", "points": [_point("original", 0, 10.0, 0.3), _point("runs/a", 1, 11.0, 0.2)]}
    two = {**base, "command": "c2", "points": [_point("original", 0, 10.0, 0.3), _point("runs/a", 1, 11.5, 0.2),
                                               _point("runs/b", 1, 12.0, 0.2)]}
    (tmp_path / "lazy_probe_trained.json").write_text(json.dumps(one))
    (tmp_path / "lazy_probe_trained_b.json").write_text(json.dumps(two))
    md = render_lazy_results(probe, tmp_path)
    assert md.count("| runs/a |") == 1 and md.count("| runs/b |") == 1 and "11.00" in md and "11.50" not in md
    assert "c1` and `c2" in md
