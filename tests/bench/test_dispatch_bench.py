"""focusattn bench-dispatch: the break-even rule, the files it writes, and that the dispatcher reads them back."""
import json

import pytest

from focusattn.bench.dispatch import _first_win, run_dispatch_bench
from focusattn.kernels import dispatch


def _rows(pairs):
    return [{"T": t, "masked": {"cpu_s": m}, "decomposed": {"cpu_s": d}} for t, m, d in pairs]


@pytest.mark.parametrize("pairs, expected", [
    ([(256, 1, 2), (512, 2, 2.5), (1024, 4, 3), (2048, 8, 5)], 1024),  # crosses once
    ([(256, 1, 0.5), (512, 2, 2.5), (1024, 4, 3)], 1024),  # an early win that does not last is not taken
    ([(256, 1, 2), (512, 2, 3)], 513),  # never wins: masked up to every measured length
    ([(2048, 8, 5), (256, 1, 0.9), (1024, 4, 3)], 256),  # wins everywhere (rows in any order)
])
def test_break_even_is_the_first_length_from_which_the_sparse_branch_stays_faster(pairs, expected):
    assert _first_win(_rows(pairs), "T", "masked", "decomposed") == expected


def test_tiny_run_writes_thresholds_the_dispatcher_reads(tmp_path):
    doc = run_dispatch_bench(tmp_path, prefill_lengths=(24, 48), decode_lengths=(24, 48), top_ks=(1, 2),
                             decode_top_ks=(1,), groups=4, window=4, heads=2, kv_heads=1, head_dim=8, repeats=1,
                             decode_steps=2, layer_step=10, command="test")
    assert [(r["T"], r["top_k"]) for r in doc["prefill"]] == [(24, 1), (24, 2), (48, 1), (48, 2)]
    assert all(r[b]["cpu_s"] > 0 for r in doc["prefill"] for b in ("masked", "decomposed", "causal"))
    assert all(r[b]["cpu_s"] > 0 for r in doc["decode"] for b in ("decode-masked", "gather", "causal"))
    table = dispatch.load_breakevens(tmp_path / "dispatch.json")["cpu"]
    assert set(table.prefill) == {1, 2} and set(table.decode) == {1}
    assert all(v in (24, 48, 49) for v in (*table.prefill.values(), *table.decode.values()))
    assert json.loads((tmp_path / "dispatch_bench.json").read_text())["thresholds"]["cpu"][
        "prefill_decomposed_min_tokens"] == {str(k): v for k, v in table.prefill.items()}


def test_bad_input_and_bad_files(tmp_path):
    with pytest.raises(ValueError, match="top_ks must be at most groups/2"):
        run_dispatch_bench(tmp_path, top_ks=(3,), groups=4)
    with pytest.raises(ValueError, match="prefill_lengths"):
        run_dispatch_bench(tmp_path, prefill_lengths=())
    bad = tmp_path / "bad.json"
    bad.write_text('{"devices": {"cpu": {"prefill_decomposed_min_tokens": {}}}}')
    with pytest.raises(ValueError, match="bad.json is not a focusattn dispatch file"):
        dispatch.load_breakevens(bad)
    assert not (tmp_path / "dispatch_bench.json").exists()  # bad input wrote nothing


def test_packaged_thresholds_load_and_a_larger_top_k_uses_the_largest_measured():
    table = dispatch.load_breakevens()["cpu"]
    assert table.prefill and table.decode
    top = max(table.prefill)
    assert table.prefill_min(top + 3) == table.prefill[top]
    assert dispatch.BreakEvens().prefill_min(1) == 0  # no data: the sparse engines


def test_install_replaces_this_device_types_entry_and_keeps_the_others(tmp_path, monkeypatch):
    """A GPU's break-evens measured with ``--device cuda --install`` must not wipe the CPU's (and a CPU re-run
    keeps a GPU's): each device type's entry is replaced alone, with its own command."""
    packaged = tmp_path / "dispatch.json"
    gpu = {"prefill_decomposed_min_tokens": {"1": 65536}, "decode_gather_min_tokens": {"1": 8192},
           "measured_on": "GPU X"}
    packaged.write_text(json.dumps({"schema": "focusattn.dispatch/1", "devices": {"cuda": gpu}}))
    monkeypatch.setattr(dispatch, "DATA_FILE", packaged)
    run_dispatch_bench(tmp_path / "run", prefill_lengths=(24,), decode_lengths=(24,), top_ks=(1,), decode_top_ks=(1,),
                       groups=4, window=4, heads=2, kv_heads=1, head_dim=8, repeats=1, decode_steps=1, layer_step=10,
                       install=True, command="cpu run")
    tables = dispatch.load_breakevens(packaged)
    assert set(tables) == {"cpu", "cuda"} and tables["cuda"].prefill == {1: 65536}
    devices = json.loads(packaged.read_text())["devices"]
    assert devices["cpu"]["command"] == "cpu run" and devices["cuda"]["measured_on"] == "GPU X"


def test_a_gpu_run_is_decided_on_gpu_time_and_refused_without_one(tmp_path, monkeypatch):
    from focusattn.bench import dispatch as bench

    rows = [{"T": t, "masked": {"gpu_s": m, "cpu_s": 0.0}, "decomposed": {"gpu_s": d, "cpu_s": 1.0}}
            for t, m, d in ((4096, 1, 2), (65536, 9, 5))]
    assert _first_win(rows, "T", "masked", "decomposed", bench._metric("cuda")) == 65536
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda': no CUDA device"):
        run_dispatch_bench(tmp_path, device="cuda")
    with pytest.raises(ValueError, match="device='tpu': allowed 'cpu', 'cuda'"):
        run_dispatch_bench(tmp_path, device="tpu")
