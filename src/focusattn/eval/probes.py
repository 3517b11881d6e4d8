"""Long-range probes, where sparse attention fails first: repeat-copy perplexity and passkey retrieval.

* **repeat copy**: a held-out passage of ``passage`` tokens appears twice, the copies ``distance`` or more tokens apart
  with held-out filler between them; we score the second copy (every token after its first). A model that attends
  back to the first copy predicts it almost perfectly; one that cannot sees ordinary text.
* **passkey**: a five-digit number is stated once at a relative ``depth`` of filler text; the sequence ends with a
  question and the answer prefix. Scored teacher-forced: correct when the model's argmax is the right token at every
  answer position, which is exactly what greedy decoding would produce (each step sees the right digits before it).

Both build their sequences deterministically from a token array (the held-out split of a corpus) and a seed, so
every model variant sees the same inputs.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from tqdm.auto import tqdm

PASSKEY_INTRO = "There is a pass key hidden in the following text. Remember it.\n"
PASSKEY_NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"


def _slice(ids: np.ndarray, start: int, n: int) -> np.ndarray:
    start = start % max(1, len(ids) - n)
    return np.asarray(ids[start:start + n], dtype=np.int64)


def repeat_copy_sequences(ids: np.ndarray, length: int, *, passage: int = 256, distance: int = 1024, n: int = 2,
                          seed: int = 0) -> list[tuple[np.ndarray, int]]:
    """``n`` sequences of ``length`` tokens ``[filler | P | filler | P]`` with the copies ``>= distance`` apart.

    Returns ``(tokens, start of the second copy)`` pairs."""
    if distance < passage or length < distance + passage:
        raise ValueError(f"length {length} cannot hold a {passage}-token passage repeated {distance} tokens later")
    if len(ids) < length + passage:
        raise ValueError(f"corpus has {len(ids)} tokens, too few for repeat-copy sequences of {length}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = _slice(ids, int(rng.integers(0, len(ids))), passage)
        lead = length - distance - passage
        filler = _slice(ids, int(rng.integers(0, len(ids))), lead + distance - passage)
        seq = np.concatenate([filler[:lead], p, filler[lead:], p])
        out.append((seq, length - passage))
    return out


@torch.no_grad()
def repeat_copy_ppl(model, sequences, *, desc: str = "repeat copy", progress: bool = True) -> dict:
    """Perplexity of the second copies (their first token excluded: nothing announces where a copy starts)."""
    nll, count = 0.0, 0
    device = next(model.parameters()).device
    for seq, start in tqdm(sequences, desc=desc, leave=False, disable=not progress):
        x = torch.as_tensor(seq[None], device=device)
        logits = model(x, logits_to_keep=len(seq) - start).logits[0, :-1].float()
        target = x[0, start + 1:]
        nll += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
        count += target.numel()
    return {"ppl": math.exp(nll / count), "nll": nll / count, "tokens": count, "sequences": len(sequences)}


def passkey_sequences(ids: np.ndarray, tokenizer, length: int, *, depths=(0.1, 0.5, 0.9), per_depth: int = 1,
                      seed: int = 0) -> list[dict]:
    """Sequences of exactly ``length`` tokens: intro, filler with the needle at ``depth``, question, answer."""
    rng = np.random.default_rng(seed)
    enc = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    out = []
    for depth in depths:
        for _ in range(per_depth):
            key = int(rng.integers(10_000, 100_000))
            intro, needle, question = enc(PASSKEY_INTRO), enc(PASSKEY_NEEDLE.format(key=key)), enc(PASSKEY_QUESTION)
            full_q = enc(PASSKEY_QUESTION + f" {key}.")
            answer = full_q[len(question):]
            if full_q[:len(question)] != question or not answer:
                raise ValueError("the tokenizer does not split the passkey answer from its question")
            n_fill = length - len(intro) - len(needle) - len(question) - len(answer)
            if n_fill < 16:
                raise ValueError(f"length {length} is too short for the passkey probe")
            filler = _slice(ids, int(rng.integers(0, len(ids))), n_fill).tolist()
            at = int(round(depth * n_fill))
            seq = intro + filler[:at] + needle + filler[at:] + question + answer
            out.append({"tokens": np.asarray(seq, dtype=np.int64), "answer_len": len(answer), "depth": depth,
                        "key": key, "distance": len(filler) - at + len(question)})
    return out


@torch.no_grad()
def passkey_accuracy(model, sequences, *, desc: str = "passkey", progress: bool = True) -> dict:
    """Share of sequences whose whole answer is the argmax at every answer position (= greedy decoding)."""
    device = next(model.parameters()).device
    hits, by_depth = 0, {}
    for s in tqdm(sequences, desc=desc, leave=False, disable=not progress):
        x = torch.as_tensor(s["tokens"][None], device=device)
        a = s["answer_len"]
        pred = model(x, logits_to_keep=a + 1).logits[0, :-1].argmax(-1)
        ok = bool(torch.equal(pred, x[0, -a:]))
        hits += ok
        by_depth.setdefault(str(s["depth"]), []).append(ok)
    return {"accuracy": hits / len(sequences), "n": len(sequences),
            "by_depth": {d: sum(v) / len(v) for d, v in by_depth.items()}}
