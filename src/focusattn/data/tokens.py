"""Tokenise a corpus once into cached token files (memory-mapped ``.npy``) and cut them into windows."""
from __future__ import annotations

import hashlib

import numpy as np

from .._io import atomic_path
from .._errors import InputError
from .cache import cache_dir
from .corpora import Corpus


def _encode(docs, tokenizer) -> np.ndarray:
    eos = tokenizer.eos_token_id
    out: list[int] = []
    for d in docs:
        ids = tokenizer(d.text, add_special_tokens=False).input_ids
        out.extend(ids)
        if eos is not None:
            out.append(eos)  # document boundary
    return np.asarray(out, dtype=np.int32)


def tokenize(corpus: Corpus, tokenizer, *, tokenizer_id: str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(train_ids, val_ids)``; cached by corpus content and tokenizer, memory-mapped on later calls."""
    h = hashlib.sha1()
    h.update(tokenizer_id.encode())
    h.update(str(len(tokenizer)).encode())
    for split in (corpus.train, corpus.val):
        for d in split:
            h.update(d.title.encode())
            h.update(str(len(d.text)).encode())
    key = f"{corpus.name.replace('/', '_')}-{h.hexdigest()[:12]}"
    out = []
    for split, docs in (("train", corpus.train), ("val", corpus.val)):
        path = cache_dir() / "tokens" / f"{key}-{split}.npy"
        if not path.exists():
            ids = _encode(docs, tokenizer)
            with atomic_path(path) as tmp:
                with open(tmp, "wb") as f:
                    np.save(f, ids)
        out.append(np.load(path, mmap_mode="r"))
    return out[0], out[1]


def check_length(ids: np.ndarray, seq_len: int, what: str, need: int = 1) -> None:
    if len(ids) < seq_len * need + 1:
        raise InputError("seq_len", seq_len, f"{what} has {len(ids):,} tokens, too short for {need} window(s) of "
                         "this length: use a larger corpus or a shorter sequence length")


def eval_windows(ids: np.ndarray, seq_len: int, max_windows: int | None) -> np.ndarray:
    """Deterministic non-overlapping windows, spread evenly over the whole split when capped."""
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise InputError("seq_len", seq_len, f"the evaluation split has only {len(ids)} tokens")
    picks = np.arange(n) if max_windows is None or max_windows >= n else np.linspace(0, n - 1, max_windows).round()
    return np.stack([np.asarray(ids[int(i) * seq_len:(int(i) + 1) * seq_len]) for i in picks])
