"""``focusattn fit-keys``: a key-space Focus adapter (``FocusConfig.router_input="keys"``), its centroids fitted by
k-means on the frozen model's own keys over training text, no gradient. Why k-means and not training: the measured
gap between the learned router and the oracle was the router's input, not its fit (docs/DECISIONS.md, "Routing in
the layer's own key space"); k-means of the keys is the baseline that closed most of it."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .._errors import InputError
from .._io import write_json
from ..focus.config import FocusConfig
from ..kernels import recall


FIT_LENGTH = 8192  # the default fitting length (capped by the model's positions): the longest this project serves


@dataclass(frozen=True)
class KeyFitConfig:
    """model: alias, hub id or folder. corpora: registers whose *train* splits fit the centroids. windows: windows
    of ``length`` tokens per corpus; ``length`` None = the model's positions, at most :data:`FIT_LENGTH`: fit at the
    longest length served, since keys after RoPE at positions never fitted on fall into a few clusters (measured:
    centroids fitted at 2048 put half of a layer's keys in one group at 8192). focus: the adapter's config
    (``router_input="keys"``). dense_heads: a ``--dense-heads`` spec (``hf.heads.parse_dense_heads``) or None.
    iters / seed: Lloyd's k-means."""

    model: str = "smollm2-135m"
    corpora: tuple[str, ...] = ("shakespeare", "python-docs")
    windows: int = 1
    length: int | None = None
    focus: FocusConfig = field(default_factory=lambda: FocusConfig(num_groups=256, router_input="keys", top_k=1,
                                                                    budget=0.15))
    dense_heads: str | None = None
    iters: int = 10
    seed: int = 0
    out: str = "runs/keys"

    def __post_init__(self):
        if not self.corpora:
            raise InputError("corpora", self.corpora, "allowed one or more corpus names")
        for name in ("windows", "length", "iters"):
            v = getattr(self, name)
            if name == "length" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(name, v, "allowed an integer >= 1")
        if self.focus.router_input != "keys":
            raise InputError("router_input", self.focus.router_input, "allowed 'keys' (fit-keys fits key centroids)")
        if self.dense_heads is not None:
            from ..hf.heads import parse_dense_heads

            parse_dense_heads(self.dense_heads)


@torch.no_grad()
def fit_key_centroids(model, windows: np.ndarray, *, iters: int = 10, seed: int = 0) -> dict[int, int]:
    """Fit every key-space router of ``model`` (composed with ``router_input="keys"``) on ``windows`` [N, T]: each
    layer's keys (KV heads side by side, the frozen model's own, full attention) clustered by k-means into its K
    centroids. Returns layer -> the size of its largest cluster on these keys."""
    from ..hf.compose import routers
    from ..hf.probe import capture

    keys: dict[int, list[torch.Tensor]] = {}
    with capture(model, lambda layer, module, h, q, k, scale, softcap: keys.setdefault(layer, []).append(
            recall.keys_side_by_side(k).flatten(0, 1))):
        for w in tqdm(windows, desc="capture keys", unit="window"):
            model(torch.as_tensor(np.asarray(w)[None], dtype=torch.long), logits_to_keep=1)
    largest = {}
    for layer, r in enumerate(tqdm(routers(model), desc="k-means", unit="layer")):
        x = torch.cat(keys.pop(layer))
        c = recall.fit_kmeans(x, r.cfg.num_groups, iters=iters, seed=seed)
        r.centroids.copy_(c.to(r.centroids))
        largest[layer] = int(torch.bincount(r.clusters(x[None])[0], minlength=r.cfg.num_groups).max())
    return largest


def fit_keys(cfg: KeyFitConfig, *, command: str = "") -> dict:
    """Load the model, compose the key-space router, fit it, resolve dense heads, save ``out/adapter`` and
    ``out/summary.json``."""
    import focusattn as fa
    from ..data.corpora import load_corpus
    from ..data.tokens import check_length, eval_windows, tokenize
    from ..hf.compose import compose, update_config
    from ..hf.heads import parse_dense_heads, scored_heads
    from ..hf.io import save_adapter

    from .._cli_common import model_positions

    length = cfg.length or min(FIT_LENGTH, model_positions(cfg.model) or FIT_LENGTH)
    model, tok = fa.load_model(cfg.model)
    model.eval()
    compose(model, cfg.focus)
    wins = []
    for corpus in cfg.corpora:
        train = tokenize(load_corpus(corpus), tok, tokenizer_id=cfg.model)[0]
        check_length(train, length, f"{corpus} train split")
        wins.append(eval_windows(train, length, cfg.windows))
    t0 = time.time()
    largest = fit_key_centroids(model, np.concatenate(wins), iters=cfg.iters, seed=cfg.seed)
    fit_s = time.time() - t0
    if cfg.dense_heads is not None:
        spec = parse_dense_heads(cfg.dense_heads)
        update_config(model, dense_heads=scored_heads(model, spec) if isinstance(spec, dict) else spec)
    out = Path(cfg.out)
    save_adapter(model, out / "adapter")
    keys_fitted = sum(len(w) for w in wins) * length
    summary = {"command": command, "config": json.loads(json.dumps(asdict(cfg), default=str)),
               "focus_config": fa.hf.focus_config(model).to_dict(), "fit_seconds": fit_s, "length": length,
               "keys_per_layer": keys_fitted,
               "largest_cluster_share": {str(k): v / keys_fitted for k, v in largest.items()},
               "adapter": str(out / "adapter")}
    write_json(out / "summary.json", summary)
    return summary
