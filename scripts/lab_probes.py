"""The lab's open Lazy findings, measured (issue: extrapolation, the first-query question). Trains the four
one-factor variants with `focusattn compare` (preset lab-long, ~6 min a run on 1 core; finished runs are reused),
then evaluates them at 1x/2x/4x length on Shakespeare (held-out works) and Lee news (another kind of text), with the
evaluation-time interventions of focusattn.gpt.probes, and the empty-row probe. Writes docs/results/lab.probes.json.

    PYTHONPATH=src python scripts/lab_probes.py --seeds 1 --out runs/lab-probes

At T = 512 (issue 25; the runs of `make lab-sink`, reused):

    PYTHONPATH=src python scripts/lab_probes.py --preset lab-sink --variants standard,elastic-only,lazy --seeds 3 \
        --out runs/lab-sink --json docs/results/lab.sink_probes.json
"""
import argparse
import sys
from pathlib import Path

import torch

from focusattn import _io
from focusattn.gpt.compare import run_compare
from focusattn.gpt.config import get_preset
from focusattn.gpt.data import load_data
from focusattn.eval.lazy_probe import zero_tiles
from focusattn.gpt.probes import empty_rows_probe, extrapolation, load_run, render_markdown

VARIANTS = ("standard", "elastic-only", "lazy-no-bias", "lazy")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--preset", default="lab-long")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--out", default="runs/lab-probes")
    p.add_argument("--json", default="docs/results/lab.probes.json")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list; the first is the empty-row reference")
    a = p.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    torch.set_num_threads(1)
    run_compare(variants, a.seeds, a.preset, a.out, threads=1, progress=False,
                command=f"focusattn compare --attention {','.join(variants)} --seeds {a.seeds} --preset {a.preset} "
                        f"--out {a.out} --threads 1")
    datas = {"shakespeare": load_data("shakespeare"), "lee-news": load_data("lee-news")}
    extra, empty = [], {v: [] for v in variants}
    for s in range(a.seeds):
        models = {v: load_run(Path(a.out) / v / f"seed{s}") for v in variants}
        extra += [{**r, "seed": s} for r in extrapolation(models, datas, a.windows)]
        for v, rec in empty_rows_probe(models, datas["shakespeare"], a.windows, reference=variants[0]).items():
            empty[v].append(rec)
    tiles = {v: [] for v in variants}  # what the exact zeros buy: causal 64 x 64 blocks entirely 0, per layer
    x, _ = datas["shakespeare"].val_windows(get_preset(a.preset, "lazy")[0].block_size, a.windows)
    for s in range(a.seeds):
        for v in variants:
            with torch.no_grad():
                weights = load_run(Path(a.out) / v / f"seed{s}").attention_weights(x)
            tiles[v].append([float(zero_tiles(w).mean()) for w in weights])
    mcfg, _ = get_preset(a.preset, "lazy")
    doc = {"command": "PYTHONPATH=src python scripts/lab_probes.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "preset": a.preset, "block_size": mcfg.block_size, "seeds": list(range(a.seeds)), "windows": a.windows,
           "variants": variants, "extrapolation": extra, "empty_rows": empty,
           "zero_tiles": {"tile": 64, "per_seed_per_layer": tiles}}
    _io.write_json(a.json, doc)
    print(render_markdown(doc))


if __name__ == "__main__":
    main()
