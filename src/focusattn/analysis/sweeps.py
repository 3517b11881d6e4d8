"""One-factor-at-a-time sweeps around the default (the Focus paper's Table 9 analogue, at the demo budget).

Each sweep point is a plain ``focusattn retrofit`` summary (``docs/results/sweep_*.json``, ``make sweeps``); the factor
a point varies is read from its configuration (the Focus field that differs from ``sweep_default.json``), never from
its file name.
"""
from __future__ import annotations

from .report import _f

FACTORS = {"num_groups": "K", "window": "w", "tau": "τ", "group_dim": "d_g"}  # the swept FocusConfig fields
DEFAULT = "default"


def _varied(s: dict, base: dict) -> list[str]:
    f, g = s["config"]["focus"], base["config"]["focus"]
    return [k for k in sorted(set(f) | set(g)) if f.get(k) != g.get(k)]


def sweep_rows(summaries: dict[str, dict]) -> list[dict]:
    """``{name: summary}`` (one named ``default``) -> rows ordered by factor then value; the default appears once
    per factor at its own value, as the reference point."""
    if DEFAULT not in summaries:
        raise ValueError(f"sweep: no '{DEFAULT}' point (sweep_{DEFAULT}.json) to compare the others with")
    base = summaries[DEFAULT]
    budget = {k: base["config"][k] for k in ("steps", "seq_len", "batch_size", "grad_accum", "seed")}
    rows, other = [], []
    for name, s in summaries.items():
        if name == DEFAULT:
            continue
        diff_budget = [k for k, v in budget.items() if s["config"].get(k) != v]
        if diff_budget:
            raise ValueError(f"sweep point {name!r}: budget differs from the default in {diff_budget}: not one factor")
        v = _varied(s, base)
        if len(v) != 1 or v[0] not in FACTORS:
            other.append(name)
            continue
        rows.append({"factor": v[0], "value": s["config"]["focus"][v[0]], "name": name, "summary": s})
    if other:
        raise ValueError(f"sweep points {other} vary no single swept factor ({', '.join(FACTORS)}) from the default")
    for factor in FACTORS:
        if any(r["factor"] == factor for r in rows):
            rows.append({"factor": factor, "value": base["config"]["focus"][factor], "name": DEFAULT, "summary": base})
    order = list(FACTORS)
    return sorted(rows, key=lambda r: (order.index(r["factor"]), r["value"]))


def render_markdown(summaries: dict[str, dict]) -> str:
    rows = sweep_rows(summaries)
    base = summaries[DEFAULT]
    c, f = base["config"], base["config"]["focus"]
    head = ["factor", "value", "domain soft", "domain top-1", "domain top-2", "OOD soft", "OOD top-1", "OOD top-2",
            "pairs kept top-1", "pairs kept top-2", "mean dominance"]
    lines = [f"One factor at a time around the default (K={f['num_groups']}, w={f['window']}, τ={f['tau']}, "
             f"d_g={f['group_dim']}); every point {c['steps']} steps x {c['batch_size'] * c['grad_accum']} x "
             f"{c['seq_len']} tokens, seed {c['seed']}. Perplexity before Focus: domain "
             f"{_f(base['perplexity']['before'].get('domain'))}, OOD {_f(base['perplexity']['before'].get('ood'))}. "
             "Pairs kept = share of causal pairs hard top-k keeps (lower = sparser); read perplexity with dominance "
             "(a collapsed router keeps every pair and looks good).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s = r["summary"]
        a, pk, g = s["perplexity"]["after"], s.get("pairs_kept") or {}, s.get("groups") or []
        value = f"**{r['value']}** (default)" if r["name"] == DEFAULT else str(r["value"])
        cells = [FACTORS[r["factor"]], value]
        cells += [_f(a["domain"].get(k)) for k in ("soft", "top1", "top2")]
        cells += [_f(a.get("ood", {}).get(k)) for k in ("soft", "top1", "top2")]
        cells += [f"{100 * pk[k]:.1f}%" if k in pk else "—" for k in ("top1", "top2")]
        cells.append(f"{sum(x['dominance'] for x in g) / len(g):.3f}" if g else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Commands:", ""] + [f"- {n}: `{s.get('command')}`" for n, s in summaries.items()]
    return "\n".join(lines)
