"""The benchmark's bookkeeping (not its speed): same-run medians, ratio = lazy / SDPA, JSON + PNG written."""
import json
import statistics

import pytest

from focusattn.lazy.bench import run_lazy_bench


def test_bench_writes_consistent_json_and_png(tmp_path):
    res = run_lazy_bench(tmp_path, T=32, B=1, H=2, D=8, W=8, block=8, reps=3)
    on_disk = json.loads((tmp_path / "lazy_bench.json").read_text())
    assert on_disk["results"].keys() == {"forward", "forward_backward"}
    for r in on_disk["results"].values():
        assert len(r["sdpa_s"]) == len(r["lazy_s"]) == 3
        assert r["sdpa_median_s"] == statistics.median(r["sdpa_s"])
        assert r["ratio"] == pytest.approx(r["lazy_median_s"] / r["sdpa_median_s"])
    assert res["shape"] == {"B": 1, "H": 2, "T": 32, "D": 8, "W": 8}
    assert (tmp_path / "lazy_bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_rejects_zero_reps(tmp_path):
    with pytest.raises(ValueError, match="reps"):
        run_lazy_bench(tmp_path, T=8, reps=0)
