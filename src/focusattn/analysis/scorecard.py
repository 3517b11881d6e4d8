"""Where one adapter stands against issue 22's targets, check by check, from the committed ``long-eval`` and
``bench-model`` JSON of that very name (what a user loads): the kept pairs, perplexity on every register, repeat-copy
and passkey against the original of the same windows, distant attention dropped over the oracle's at the same budget,
whole-model prefill, and each training-free baseline at its budget on the same rows.

Why a generated card: the targets span a dozen runs (three registers, three lengths, baselines in runs of their
own); read off by hand, a missed row is easy to overlook and a met one easy to overstate.
"""
from __future__ import annotations

from .pareto import BASELINES, _adapter_name

# Issue 22's targets: kept pairs at 8192 at most PAIRS; perplexity at most +PPL; repeat-copy perplexity at most REPEAT
# times the original's; passkey at least PASSKEY of the original's accuracy; distant attention dropped at most ORACLE
# times the oracle's; prefill at 8192 at least PREFILL times the original's.
PAIRS, PPL, REPEAT, PASSKEY, ORACLE, PREFILL = 0.25, 0.02, 1.2, 5 / 6, 1.5, 1.4
PAIRS_T = PREFILL_T = 8192
# The baselines the adapter must beat at its budget (``NAME@top1`` long-eval variants), by their table names.
RIVALS = ("sliding", "random", "untrained", "kmeans")
# long-eval's default out-of-domain register: its runs give the kept pairs and the training register's measures
NEWS = "lee-news"
# a value at a target's edge meets it (10.2 / 10 - 1 is 0.020000000000000018 in floats)
EPS = 1e-9


def _cells(name: str, docs: list[dict]) -> dict:
    """``{(T, register): {variant: row}}`` over every long-eval of ``name`` (news and other registers: the OOD text,
    which also holds the passkeys and the repeated passage), merged across runs (a baselines-only run adds its
    variants beside the adapter's own run on the same windows); ``row["ppl_domain"]`` is the training register's."""
    out: dict = {}
    for d in docs:
        if _adapter_name(d) != name:
            continue
        for r in d["results"]:
            if r["variant"].startswith("top") and r["variant"] != "top1":
                continue
            cell = out.setdefault((r["T"], d["corpora"]["ood"]), {}).setdefault(r["variant"], {})
            for k, v in r.items():
                cell.setdefault(k, v)
            if r.get("distant_dropped"):
                cell["distant_dropped"] = {**r["distant_dropped"], **cell.get("distant_dropped", {})}
    return out


def scorecard(name: str, long_docs: list[dict], bench_docs: list[dict]) -> list[dict]:
    """One dict per check: ``target``, ``where`` (length and register), ``value`` (text) and ``ok`` (bool)."""
    cells = _cells(name, long_docs)
    checks = []

    def add(target, where, value, ok):
        checks.append({"target": target, "where": where, "value": value, "ok": bool(ok)})

    for (t, reg), vs in sorted(cells.items()):
        me, base = vs.get("top1"), vs.get("original")
        if me is None or base is None:
            continue
        if t == PAIRS_T and me.get("budget_pairs_kept") is not None and reg == NEWS:
            add(f"causal pairs kept ≤ {PAIRS:.0%}", f"T={t}", f"{me['budget_pairs_kept']:.1%}",
                me["budget_pairs_kept"] <= PAIRS + EPS)
        for key, split in (("ppl_domain", "domain"), ("ppl_ood", reg)):
            if split == "domain" and reg != NEWS:
                continue  # the training register's windows are those of the run beside news: counted once
            if me.get(key) is not None and base.get(key):
                ch = me[key] / base[key] - 1
                add(f"perplexity ≤ +{PPL:.0%}", f"T={t} {split}", f"{ch:+.1%}", ch <= PPL + EPS)
        if me.get("repeat_ppl") is not None and base.get("repeat_ppl"):
            x = me["repeat_ppl"] / base["repeat_ppl"]
            add(f"repeat-copy ≤ {REPEAT:g}x the original's", f"T={t} {reg}",
                f"{me['repeat_ppl']:.2f} / {base['repeat_ppl']:.2f} = {x:.2f}x", x <= REPEAT + EPS)
        pk, pb = me.get("passkey") or {}, base.get("passkey") or {}
        if "n" in pk and "n" in pb:
            hit, orig = round(pk["accuracy"] * pk["n"]), round(pb["accuracy"] * pb["n"])
            add("passkey ≥ 5/6 of the original's", f"T={t} {reg}", f"{hit}/{pk['n']} (original {orig}/{pb['n']})",
                pk["accuracy"] >= PASSKEY * pb["accuracy"] - EPS)
        oracle = next((v for k, v in vs.items() if k.startswith("oracle@")), None)
        mine, theirs = me.get("distant_dropped") or {}, (oracle or {}).get("distant_dropped") or {}
        for split in ("domain", "ood"):
            if split == "domain" and reg != NEWS:
                continue
            if split in mine and theirs.get(split):
                x = mine[split] / theirs[split]
                add(f"distant attention dropped ≤ {ORACLE:g}x the oracle's", f"T={t} "
                    f"{'domain' if split == 'domain' else reg}", f"{mine[split]:.1%} / {theirs[split]:.1%} = {x:.2f}x",
                    x <= ORACLE + EPS)
        for rival in RIVALS:
            other = vs.get(f"{rival}@top1")
            if other is not None:
                lost = _lost_to(me, other)
                add(f"beats {BASELINES[rival]} at its budget", f"T={t} {reg}",
                    "ahead or level on every measure" if not lost else "behind on " + ", ".join(lost), not lost)
    for b in bench_docs:
        if _adapter_name(b) != name:
            continue
        for r in b["results"]:
            if r["T"] == PREFILL_T and r["variant"] == "top1":
                out = (b.get("command") or "").partition("--out ")[2].split(" ")[0]
                add(f"prefill ≥ {PREFILL:g}x the original's", f"T={r['T']}" + (f" (`{out}`)" if out else ""),
                    f"{r['prefill_speedup']:.2f}x", r["prefill_speedup"] >= PREFILL - EPS)
    return checks


def _lost_to(me: dict, other: dict) -> list[str]:
    """The measures on which ``other`` is strictly better than ``me`` (lower perplexity, repeat-copy and distant
    attention dropped; more passkeys)."""
    lost = []
    for key, label in (("ppl_domain", "domain perplexity"), ("ppl_ood", "register perplexity"),
                       ("repeat_ppl", "repeat-copy")):
        if me.get(key) is not None and other.get(key) is not None and other[key] < me[key]:
            lost.append(f"{label} ({other[key]:.2f} < {me[key]:.2f})")
    pm, po = (me.get("passkey") or {}).get("accuracy"), (other.get("passkey") or {}).get("accuracy")
    if pm is not None and po is not None and po > pm + EPS:
        lost.append(f"passkey ({po:.0%} > {pm:.0%})")
    dm, do = me.get("distant_dropped") or {}, other.get("distant_dropped") or {}
    for split in ("domain", "ood"):
        if split in dm and split in do and do[split] < dm[split]:
            lost.append(f"{split} attention dropped ({do[split]:.1%} < {dm[split]:.1%})")
    return lost


def render_scorecard(name: str, long_docs: list[dict], bench_docs: list[dict]) -> str:
    """Markdown: the checks of :func:`scorecard` as a table, then how many are met."""
    return _card(name, scorecard(name, long_docs, bench_docs))


def _card(name: str, checks: list[dict]) -> str:
    if not checks:
        return f"_No long-eval of `{name}` yet._"
    lines = ["| target | where | measured | met |", "|---|---|---|---|"]
    lines += [f"| {c['target']} | {c['where']} | {c['value']} | {'yes' if c['ok'] else '**no**'} |" for c in checks]
    met = sum(c["ok"] for c in checks)
    lines += ["", f"{met} of {len(checks)} checks met. Registers: `shakespeare` is the one the routing was fitted on "
              "(its perplexity counted once per length), `lee-news` and `python-code` are not; passkeys and the "
              "repeated passage are hidden in the register's own text."]
    return "\n".join(lines)


def render_scorecards(names: list[str], long_docs: list[dict], bench_docs: list[dict]) -> str:
    """Per adapter of ``names`` long-evaluated at 2048 and 8192: how many checks it meets and which targets it
    misses, then each one's whole card (folded)."""
    def lengths(c):
        return {x["where"].split(" ")[0] for x in c if not x["target"].startswith("prefill")}

    cards = {n: scorecard(n, long_docs, bench_docs) for n in names}
    cards = {n: c for n, c in cards.items() if {"T=2048", "T=8192"} <= lengths(c)}
    if not cards:
        return "_No adapter measured at 2048 and 8192 yet._"
    lines = ["| adapter | checks met | targets missed (where) |", "|---|---|---|"]
    for n, c in cards.items():
        missed: dict[str, dict] = {}
        for x in c:
            if not x["ok"]:
                missed.setdefault(x["target"], {})[x["where"].split(" (")[0]] = None
        text = "; ".join(f"{t} ({', '.join(w)})" for t, w in missed.items()) or "none"
        lines.append(f"| `{n}` | {sum(x['ok'] for x in c)} / {len(c)} | {text} |")
    for n, c in cards.items():
        lines += ["", f"<details><summary>The card of <code>{n}</code></summary>", "", _card(n, c), "", "</details>"]
    return "\n".join(lines)
