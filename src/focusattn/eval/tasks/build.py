"""Build the offline lm-eval task data (``--tasks offline``) deterministically from real English prose.

Source: the prose paragraphs of Python's own language reference as shipped in the standard library
(``pydoc_data.topics``: the text ``help("while")`` prints). Neither training corpus used here (Shakespeare, Lee news)
contains it. Code samples, grammar rules and headings are dropped; only paragraphs of running English text are kept.

Tasks (all loglikelihood-based, so they run offline with any model and need no answer extraction):

- ``focus_cloze_{short,long}``: LAMBADA-style last-word cloze. The context ends just before a word that already occurs
  earlier in the context; the model must give that word. In ``long`` the earlier occurrence lies beyond the last
  ``LONG_GAP`` words (further back than a 128-token attention window reaches).
- ``focus_nextsent_{short,long}``: four-way next-sentence choice: the true continuation vs three other sentences of the
  same topic that are not in the context.
- ``focus_passkey``: a five-digit pass key hidden at depths 10%..90% of ~450 tokens of filler; the model chooses it
  among four five-digit numbers (loglikelihood of each continuation).

``short`` contexts stay under 80 words and 330 characters (< 128 tokens for a SmolLM2/GPT-2-style tokenizer; the real-model test checks
it), ``long`` contexts are 200-300 words (well over 128 tokens). Rebuild with ``python -m focusattn.eval.tasks.build``;
``--check`` verifies that the shipped files equal what the generator produces on this Python.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from pathlib import Path

OUT = Path(__file__).parent / "offline"
SEED = 20260511
SHORT_WORDS = (40, 80)
SHORT_CHARS = 330  # and at most this many characters: < 128 tokens even for symbol-heavy sentences
LONG_WORDS = (200, 300)
LONG_GAP = 110  # words: the cloze answer must not occur in the last LONG_GAP words of a long context
MAX_PER_TASK = 100
SPACING = 25  # words between two cloze answers of one topic
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
PASSKEY_PER_DEPTH = 20
PASSKEY_FILLER_SENTENCES = 60
FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
STOP = set("""a an the and or of to in on at by for with from as is are was were be been being it its this that these
those not no can may will would should could which who whom what when where how than then there their they them he she
his her we our you your if else also such any all each some more most other into only same so but do does done has have
had one two""".split())


def source_text() -> dict[str, str]:
    import pydoc_data.topics

    return dict(sorted(pydoc_data.topics.topics.items()))


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of running English: no indented (code/grammar) lines, no headings, mostly letters, ends with '.'."""
    out = []
    for p in re.split(r"\n\s*\n", text):
        lines = p.split("\n")
        if any(line.startswith(" ") for line in lines) or re.search(r"^[*=\-]{3,}$", p, re.M):
            continue
        s = " ".join(line.strip() for line in lines)
        s = re.sub(r"\s+", " ", s).strip()
        if len(s.split()) < 12 or not s.endswith(".") or sum(c.isalpha() or c == " " for c in s) / len(s) < 0.85:
            continue
        out.append(s)
    return out


def sentences(paragraph: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z\"“])", paragraph)
    return [s for s in (x.strip() for x in parts) if s]


def topic_sentences() -> dict[str, list[str]]:
    return {name: [s for p in prose_paragraphs(text) for s in sentences(p)] for name, text in source_text().items()}


def _norm(word: str) -> str:
    return re.sub(r"^[^\w]+|[^\w]+$", "", word).lower()


def _contexts(sents: list[str], lo: int, hi: int):
    """Runs of consecutive sentences whose word count lies in [lo, hi], one per start sentence (the shortest run)."""
    for i in range(len(sents)):
        n = 0
        for j in range(i, len(sents)):
            n += len(sents[j].split())
            if n > hi:
                break
            if n >= lo:
                yield i, j + 1
                break


def cloze_docs(topics: dict[str, list[str]], lo: int, hi: int, gap: int | None, rng: random.Random) -> list[dict]:
    """One example per eligible word of a topic's running text (at least ``SPACING`` words apart): the context is the
    ``lo..hi`` words before it (starting at a sentence start when one is in range)."""
    docs = []
    for name, sents in topics.items():
        words = " ".join(sents).split()
        starts = set()
        n = 0
        for s in sents:
            starts.add(n)
            n += len(s.split())
        last_taken = -SPACING
        for p in range(lo, len(words)):
            m = re.fullmatch(r"([A-Za-z]{3,})[.,;:!?]?", words[p])
            if p - last_taken < SPACING or not m or m.group(1).lower() in STOP:
                continue
            target = m.group(1)
            begin = next((b for b in range(max(0, p - hi), p - lo + 1) if b in starts), max(0, p - hi))
            before = [_norm(w) for w in words[begin:p]]
            if target.lower() not in before:
                continue  # LAMBADA-style: the answer is recoverable from the context
            if gap is not None and target.lower() in before[-gap:]:
                continue  # long: the only earlier occurrences lie beyond the local window
            if hi <= SHORT_WORDS[1] and len(" ".join(words[begin:p])) > SHORT_CHARS:
                continue
            docs.append({"topic": name, "context": " ".join(words[begin:p]), "target": target,
                         "context_words": p - begin})
            last_taken = p
    rng.shuffle(docs)
    return docs[:MAX_PER_TASK]


def nextsent_docs(topics: dict[str, list[str]], lo: int, hi: int, rng: random.Random) -> list[dict]:
    docs = []
    all_sents = [(n, s) for n, ss in topics.items() for s in ss if 6 <= len(s.split()) <= 60]
    for name, sents in topics.items():
        for i, j in _contexts(sents, lo, hi):
            if j >= len(sents) or not 6 <= len(sents[j].split()) <= 60:
                continue
            gold = sents[j]
            if hi <= SHORT_WORDS[1] and len(" ".join(sents[i:j])) > SHORT_CHARS:
                continue
            used = set(sents[i:j + 2])
            pool = [s for s in sents if s not in used and 6 <= len(s.split()) <= 60]
            if len(pool) < 3:
                pool = [s for n, s in all_sents if s not in used]
            pool = sorted(set(pool))
            choices = rng.sample(pool, 3) + [gold]
            rng.shuffle(choices)
            docs.append({"topic": name, "context": " ".join(sents[i:j]), "choices": choices,
                         "label": choices.index(gold), "context_words": sum(len(s.split()) for s in sents[i:j])})
    rng.shuffle(docs)
    return docs[:MAX_PER_TASK]


def passkey_docs(rng: random.Random) -> list[dict]:
    docs = []
    for r in range(PASSKEY_PER_DEPTH):
        for depth in DEPTHS:  # interleaved, so --limit N covers every depth
            key = rng.randrange(10000, 100000)
            distractors = set()
            while len(distractors) < 3:
                d = rng.randrange(10000, 100000)
                if d != key:
                    distractors.add(d)
            filler = [FILLER[i % len(FILLER)] for i in range(PASSKEY_FILLER_SENTENCES)]
            at = round(depth * len(filler))
            needle = f"The pass key is {key}. Remember it. {key} is the pass key."
            body = " ".join(filler[:at] + [needle] + filler[at:])
            choices = [str(x) for x in sorted(distractors) + [key]]
            rng.shuffle(choices)
            docs.append({"depth": depth, "context": body, "choices": choices, "label": choices.index(str(key)),
                         "words_after_key": sum(len(s.split()) for s in filler[at:])})
    return docs


def build() -> dict[str, list[dict]]:
    topics = topic_sentences()
    rng = random.Random(SEED)
    return {
        "focus_cloze_short": cloze_docs(topics, *SHORT_WORDS, None, rng),
        "focus_cloze_long": cloze_docs(topics, *LONG_WORDS, LONG_GAP, rng),
        "focus_nextsent_short": nextsent_docs(topics, *SHORT_WORDS, rng),
        "focus_nextsent_long": nextsent_docs(topics, *LONG_WORDS, rng),
        "focus_passkey": passkey_docs(rng),
    }


def _jsonl(docs: list[dict]) -> str:
    return "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in docs)


def manifest(data: dict[str, list[dict]]) -> dict:
    src = json.dumps(source_text(), sort_keys=True).encode()
    return {"source": "pydoc_data.topics (Python language reference)",
            "python": ".".join(map(str, sys.version_info[:3])), "source_sha256": hashlib.sha256(src).hexdigest(),
            "seed": SEED, "files": {name: {"docs": len(d), "sha256": hashlib.sha256(_jsonl(d).encode()).hexdigest()}
                                    for name, d in data.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--check", action="store_true", help="compare with the shipped files instead of writing")
    a = p.parse_args(argv)
    from ..._io import write_json, write_text

    data = build()
    out = Path(a.out)
    if a.check:
        bad = [n for n, d in data.items() if not (out / "data" / f"{n}.jsonl").is_file()
               or (out / "data" / f"{n}.jsonl").read_text() != _jsonl(d)]
        print("shipped task data matches the generator" if not bad else f"differs: {bad}")
        return 1 if bad else 0
    for name, docs in data.items():
        write_text(out / "data" / f"{name}.jsonl", _jsonl(docs))
        print(f"{name}: {len(docs)} docs")
    write_json(out / "data" / "MANIFEST.json", manifest(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
