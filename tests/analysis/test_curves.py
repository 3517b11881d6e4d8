"""A run's curves from its metrics.jsonl: the held-out rows, the smoothing of the training values, the plot."""
from focusattn.analysis.curves import held_out_rows, plot_curves, render_curves

SUMMARY = {"config": {"seq_len": 64, "focus": {"num_groups": 4}}, "perplexity": {"before": {"domain": 10.0,
                                                                                          "ood": 20.0}}}


def _recs():
    recs = [{"step": s, "kept_top1": s / 10, "largest_share": [0.25, 0.25 + s / 100]} for s in range(1, 11)]
    recs[4].update(heldout_top1=12.0, heldout_ood_top1=25.0, heldout_kept_top1=0.4)
    recs[9].update(heldout_top1=11.0, heldout_ood_top1=24.0, heldout_kept_top1=0.6)
    return recs


def test_held_out_rows_average_the_steps_up_to_each_evaluation():
    rows = held_out_rows(_recs(), smooth=2)
    assert [r["step"] for r in rows] == [5, 10]
    assert abs(rows[1]["train_kept_top1"] - 0.95) < 1e-9  # steps 9 and 10
    assert abs(rows[1]["largest_max"] - 0.345) < 1e-9 and abs(rows[0]["largest_mean"] - (0.27 + 0.275) / 2) < 1e-9  # steps 4, 5
    assert rows[0]["heldout_kept_top1"] == 0.4 and rows[1]["heldout_ood_top1"] == 24.0


def test_render_and_plot(tmp_path):
    text = render_curves(_recs(), SUMMARY, plot_link="x.png")
    assert "| 10 | 60.0% |" in text and "11.00 | 24.00 |" in text and "10.00 domain" in text and "x.png" in text
    start = render_curves(_recs(), {**SUMMARY, "heldout_start": {"step": 0, "heldout_top1": 13.0}})
    assert "| 0 | — | — | — | — / — | 13.00 | — |" in start
    recs = _recs()
    recs[9]["heldout_budget_top1"] = 0.25  # runs that recorded the keys kept show them beside the mass
    assert "| 10 | 60.0% | 25.0% |" in render_curves(recs, SUMMARY)
    assert "No held-out curve" in render_curves([{"step": 1, "largest_share": [0.5]}], SUMMARY)
    png = plot_curves(_recs(), SUMMARY, tmp_path / "c.png")
    assert png.stat().st_size > 1000 and not list(tmp_path.glob("*.tmp.png"))
