"""Where does a key/value head rank by measures that do not look at the evaluation's probes? (issue 22)

A head found by serving each routed head dense until a failing passkey of ``long-eval`` came back (``19:1`` for
``smollm2-135m-focus-keys256-floor32``) was found on the probe that then scores it. Before such a head can ship it
must stand out on something else. Per key/value head of the adapter's model (frozen attention, ``hf.probe.capture``;
per key/value head the largest of its query heads, except ``lost``, their mean):

* ``induction`` / ``duplicate``: the copy scores the shipped dense heads were chosen by (``hf.heads.copy_scores``,
  random tokens repeated once, no corpus);
* ``natural_induction``: the induction score on natural text: a 256-token passage of a corpus's *training* split
  repeated 1024 tokens later (``eval.probes.repeat_copy_sequences`` on the training split, other seeds), attention on
  the token after the aligned earlier position over the second copy;
* ``needle``: the retrieval score of Wu et al. 2024 ("Retrieval head mechanistically explains long-context
  factuality"): a needle sentence in training-split filler, then its question; over the answer's digits, the share
  whose row puts its largest attention on the needle's copy of the digit being produced, and the mean attention
  there. The template, key length and depths are not the evaluation passkey's;
* ``lost``: the attention the served mask drops on training text (share of all of the head's attention);
* ``dense_gain``: what the model loses, not where a head looks: how much serving the head dense lowers the copy
  loss (second copies of training-split passages, other seeds) of the adapter as served (:func:`dense_gain`).

python scripts/head_ranks.py --adapter smollm2-135m-focus-keys256-floor32 --heads 19:1 \
    --out docs/results/head_ranks_floor32.json
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from tqdm.auto import tqdm

import focusattn as fa
from focusattn._io import write_json
from focusattn.data.corpora import load_corpus
from focusattn.data.tokens import eval_windows, tokenize
from focusattn.eval.probes import repeat_copy_sequences
from focusattn.hf import focus_config, routers
from focusattn.hf.heads import aligned_attention, copy_scores, parse_dense_heads
from focusattn.hf.probe import capture, served_keep
from focusattn.kernels import recall as R

NEEDLE = "\nThe special number for {name} is {key}.\n"
QUESTION = "\nWhat is the special number for {name}? The special number for {name} is"
NAMES = ("Mira", "the red lantern", "Ostrava", "box seven", "the old harbour", "Tobias", "Corvin", "the blue door")


def _forward(model, x) -> None:
    model(torch.as_tensor(np.asarray(x)[None], dtype=torch.long), logits_to_keep=1)


def _per_kv(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """[Hq] -> [Hkv]: the largest of each key/value head's query heads."""
    return x.view(hkv, -1).max(-1).values


def natural_induction(model, ids, n: int, length: int = 2048, passage: int = 256,
                      distance: int = 1024) -> torch.Tensor:
    """[layers, kv_heads]: mean attention on the token after the aligned earlier position, over second copies
    (:func:`focusattn.hf.heads.aligned_attention` on natural text; the copies are ``distance`` apart)."""
    seqs = repeat_copy_sequences(ids, length, passage=passage, distance=distance, n=n, seed=11)
    return aligned_attention(model, [(x, second, length - 1, distance) for x, second in seqs],
                             kinds={"induction": 1})["induction"]


def needle_sequences(ids, tok, length: int, n_per_depth: int, seed: int = 7) -> list[dict]:
    rng = np.random.default_rng(seed)
    enc = lambda s: tok(s, add_special_tokens=False).input_ids  # noqa: E731
    out = []
    for depth in (0.2, 0.35, 0.65, 0.8):
        for _ in range(n_per_depth):
            name, key = NAMES[rng.integers(len(NAMES))], int(rng.integers(100_000, 1_000_000))
            needle, question = enc(NEEDLE.format(name=name, key=key)), enc(QUESTION.format(name=name))
            full = enc(QUESTION.format(name=name) + f" {key}.")
            digits = full[len(question):-1]  # the key's tokens: no full stop, no space before them
            while digits and not tok.decode(digits[:1]).strip():
                digits = digits[1:]
            lead = next((j for j in range(len(needle)) if needle[j:j + len(digits)] == digits), None)
            if full[:len(question)] != question or not digits or lead is None:
                raise ValueError("the tokenizer does not split the needle's key from its sentence")
            n_fill = length - len(needle) - len(full)
            start = int(rng.integers(0, len(ids) - n_fill))
            fill, at = ids[start:start + n_fill].tolist(), int(depth * n_fill)
            seq = fill[:at] + needle + fill[at:] + full
            answer = len(seq) - 1 - len(digits)  # the first digit's position in the answer
            out.append({"tokens": seq, "rows": list(range(answer - 1, answer - 1 + len(digits))),
                        "keys": list(range(at + lead, at + lead + len(digits)))})
    return out


@torch.no_grad()
def needle_scores(model, seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hits, mean)`` [layers, kv_heads]: Wu et al.'s copy-paste share (largest attention on the digit produced)
    and the mean attention on it, over every answer digit of ``seqs``."""
    hits = mean = None
    for s in tqdm(seqs, desc="needle", leave=False):
        rows, keys = torch.tensor(s["rows"]), torch.tensor(s["keys"])

        def fn(layer, module, h, q, k, scale, softcap, rows=rows, keys=keys):
            nonlocal hits, mean
            p = R.causal_probs(q, k, int(rows[0]), int(rows[-1]) + 1, scale=scale, softcap=softcap)[0]
            at = rows - rows[0]
            if hits is None:
                hits = torch.zeros(len(routers(model)), k.shape[1])
                mean = torch.zeros_like(hits)
            hits[layer] += _per_kv((p[:, at].argmax(-1) == keys).float().mean(-1), k.shape[1])
            mean[layer] += _per_kv(p[:, at, keys].mean(-1), k.shape[1])

        with capture(model, fn):
            _forward(model, s["tokens"])
    return hits / len(seqs), mean / len(seqs)


@torch.no_grad()
def attention_lost(model, windows) -> torch.Tensor:
    cfg, own = focus_config(model), routers(model)
    tot: dict[int, dict] = {}

    def fn(layer, module, h, q, k, scale, softcap):
        s = R.layer_recall(q, k, {"served": served_keep(own[layer], h, 1)}, window=cfg.window, sink=cfg.sink_tokens,
                           scale=scale, softcap=softcap)
        tot[layer] = R.add_recall(tot.get(layer), s)

    with capture(model, fn):
        for w in tqdm(windows, desc="attention lost", leave=False):
            _forward(model, w)
    lost = [(tot[i]["mass"]["distant"] - tot[i]["kept"]["served"]) / tot[i]["queries"] for i in range(len(own))]
    return torch.stack(lost).float()


@torch.no_grad()
def copy_loss(model, seqs) -> float:
    """Mean negative log-likelihood of the second copies (their first token excluded), over ``seqs``."""
    total = 0.0
    for x, second in seqs:
        x = torch.as_tensor(np.asarray(x)[None], dtype=torch.long)
        lp = model(x, logits_to_keep=x.shape[1] - second).logits[0, :-1].float().log_softmax(-1)
        total += -float(lp.gather(-1, x[0, second + 1:, None]).mean())
    return total / len(seqs)


def dense_gain(model, seqs, layers: int) -> dict:
    """How much serving a routed head dense lowers the copy loss of ``seqs`` (training text): every layer's routed
    heads together first, then each routed head of the ``layers`` best layers alone (a layer-first search: 80 single
    heads would cost 80 passes). DuoAttention (Xiao et al. 2024) finds its retrieval heads the same way in spirit, by
    the loss a head's full attention saves on calibration data, not by where its attention looks."""
    from focusattn.hf import update_config
    from focusattn.hf.compose import original_attention

    own = tuple(tuple(h) for h in focus_config(model).dense_heads)
    n_layers, hkv = len(routers(model)), model.config.num_key_value_heads
    with original_attention(model):
        original = copy_loss(model, seqs)
    served = copy_loss(model, seqs)
    by_layer, heads = {}, torch.full((n_layers, hkv), float("-inf"))
    try:
        for layer in tqdm(range(n_layers), desc="dense gain (layers)", leave=False):
            extra = tuple((layer, h) for h in range(hkv) if (layer, h) not in own)
            if extra:
                update_config(model, dense_heads=tuple(sorted(own + extra)))
                by_layer[layer] = served - copy_loss(model, seqs)
        for layer in sorted(by_layer, key=by_layer.get, reverse=True)[:layers]:
            for h in range(hkv):
                if (layer, h) not in own:
                    update_config(model, dense_heads=tuple(sorted(own + ((layer, h),))))
                    heads[layer, h] = served - copy_loss(model, seqs)
    finally:
        update_config(model, dense_heads=own)
    return {"original": original, "served": served, "layers": by_layer, "heads": heads}


def ranks(scores: torch.Tensor, dense: set, top: int) -> dict:
    """Routed heads only (the dense ones keep every pair already), best first."""
    hkv = scores.shape[1]
    order = [i for i in scores.flatten().argsort(descending=True, stable=True).tolist()
             if (i // hkv, i % hkv) not in dense]
    return {"order": [f"{i // hkv}:{i % hkv}" for i in order],
            "top": [[f"{i // hkv}:{i % hkv}", round(float(scores.flatten()[i]), 4)] for i in order[:top]]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--heads", default="19:1", help="layer:kv_head,... whose ranks to report")
    ap.add_argument("--corpora", default="shakespeare,lee-news", help="training splits used")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--n", type=int, default=4, help="sequences (windows) per corpus and measure")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--gain-layers", type=int, default=4, help="layers whose heads the dense-gain search tries "
                    "one by one (0: no dense-gain search)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    asked = parse_dense_heads(a.heads)
    model, tok = fa.load_model(a.model)
    fa.load_adapter(model, a.adapter)
    model.eval()
    dense = {tuple(p) for p in focus_config(model).dense_heads}
    measures = copy_scores(model)
    copies = []  # the dense-gain search's copy sequences, from every corpus's training split
    for corpus in a.corpora.split(","):
        train, _ = tokenize(load_corpus(corpus), tok, tokenizer_id=a.model)
        measures[f"natural_induction.{corpus}"] = natural_induction(model, train, a.n, a.length)
        hits, mean = needle_scores(model, needle_sequences(train, tok, a.length, max(1, a.n // 2)))
        measures[f"needle_hits.{corpus}"], measures[f"needle_mean.{corpus}"] = hits, mean
        lost = attention_lost(model, eval_windows(train, a.length, a.n))  # [layers, Hq]
        measures[f"lost.{corpus}"] = lost.view(lost.shape[0], measures["induction"].shape[1], -1).mean(-1)
        copies += repeat_copy_sequences(train, a.length, passage=256, distance=1024, n=max(1, a.n // 2), seed=23)
    gain = dense_gain(model, copies, a.gain_layers) if a.gain_layers else None
    if gain is not None:
        measures["dense_gain"] = gain["heads"]
    out = {"command": "python scripts/head_ranks.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "adapter": a.adapter, "length": a.length, "n": a.n, "corpora": a.corpora.split(","),
           "dense_heads": sorted(f"{x}:{y}" for x, y in dense), "measures": {}}
    if gain is not None:  # the copy loss of the original, the served adapter, and each layer's heads served dense
        out["copy_loss"] = {"original": round(gain["original"], 4), "served": round(gain["served"], 4),
                            "layer_gain": {str(k): round(v, 4) for k, v in gain["layers"].items()}}
    for name, s in measures.items():
        r = ranks(s, dense, a.top)
        out["measures"][name] = {"top": r["top"], "rank": {f"{x}:{y}": r["order"].index(f"{x}:{y}") + 1
                                                           for x, y in asked if (x, y) not in dense},
                                 "routed_heads": len(r["order"])}
        print(name, out["measures"][name]["rank"], r["top"][:6], flush=True)
    write_json(a.out, out)


if __name__ == "__main__":
    main()
