"""Attention recall in RESULTS: what each served mask keeps of the original model's attention beyond the window,
against the oracle at the same budget (the ``recall`` rows of ``long_eval*.json``), and a per-layer plot."""
from __future__ import annotations

import re
from pathlib import Path

from .._io import pyplot
from .pareto import _adapter_name


def mask_order(name: str) -> tuple:
    """Sort key of recall masks: by budget (``top1``, ``top2``, ...), the served mask first, then the oracle and
    the baselines."""
    base, _, k = name.partition("@")
    top = k or base
    kind = {"top": 0, "oracle": 1, "sliding": 2, "duo": 3, "kmeans": 4, "random": 5, "untrained": 6}
    return (top, kind.get(base.rstrip("0123456789") if not k else base, 9), name)


def masks_table(masks: dict) -> list[str]:
    """Per mask of a recall's ``overall`` (:func:`..eval.recall.measure_recall`): the distant mass it drops, the
    distant keys it keeps per query and its drop over the oracle's at the same budget."""
    out = ["| mask | distant attention dropped | distant keys kept per query | dropped / oracle's |",
           "|---|---|---|---|"]
    for name in sorted(masks, key=mask_order):
        m = masks[name]
        vs = m.get("vs_oracle")
        out.append(f"| {name} | {100 * m['dropped_distant']:.1f}% | {m['keys_per_query']:.0f} | "
                   f"{'—' if vs is None or name.startswith('oracle') else f'{vs:.2f}×'} |")
    return out


def render_recall(long_docs: list[dict], *, plot_links: dict[str, str] | None = None) -> str:
    """One table per adapter, length and split: share of attention on local / sink / distant keys (original model,
    head mean) and, per mask, the distant mass it drops, the distant keys it keeps per query and its drop over the
    oracle's at the same budget."""
    out = []
    for i, d in enumerate(long_docs):
        for rec in d.get("recall", []):
            o = rec["overall"]
            sh = o["share"]
            out += [f"**{_adapter_name(d)}**, T = {rec['T']}, {rec['split']} ({d['corpora'][rec['split']]}, "
                    f"{rec['windows']} windows): the original model puts {100 * sh['local']:.0f}% of its attention "
                    f"on the window, {100 * sh['sink']:.0f}% on the sink and {100 * sh['distant']:.0f}% on distant "
                    "keys (mean over layers and heads).", "", *masks_table(o["masks"]), ""]
            link = (plot_links or {}).get(f"{i}:{rec['T']}:{rec['split']}")
            if link:
                out += [f"![recall per layer]({link})", ""]
    if long_docs and any(d.get("command") for d in long_docs if d.get("recall")):
        out += ["Commands:", ""] + [f"- `{d['command']}`" for d in long_docs if d.get("recall") and d.get("command")]
    return "\n".join(out) if out else "_Not yet measured (`long-eval --recall-windows`)._"


def plot_recall_layers(rec: dict, path, title: str = "") -> None:
    """Distant attention dropped per layer, for every mask of one recall row."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.8))
    names = sorted(rec["layers"][0]["masks"], key=mask_order)
    for name in names:
        ys = [100 * lay["masks"][name]["dropped_distant"] for lay in rec["layers"]]
        ax.plot(range(len(ys)), ys, marker="o" if name.startswith("top") else ".", lw=1.2, label=name,
                ls="--" if name.startswith("oracle") else "-")
    ax.set_xlabel("layer")
    ax.set_ylabel("distant attention dropped (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the frame: no curve hidden
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def recall_section(long_docs: list[dict], results_dir: Path) -> str:
    """The RESULTS section: plots written beside the JSON (one per run and length, the first split; a second run of
    the same configuration, e.g. a re-measured baseline, gets its own file), tables."""
    links, taken = {}, set()
    for i, d in enumerate(long_docs):
        seen = set()
        for rec in d.get("recall", []):
            if rec["T"] in seen:
                continue
            seen.add(rec["T"])
            slug = re.sub(r"[^a-z0-9]+", "-", _adapter_name(d).lower()).strip("-")
            png, n = f"recall_{slug}_{rec['T']}_{rec['split']}.png", 1
            while png in taken:
                n += 1
                png = f"recall_{slug}_{rec['T']}_{rec['split']}_{n}.png"
            taken.add(png)
            plot_recall_layers(rec, results_dir / png, f"{_adapter_name(d)}, T={rec['T']}, {rec['split']}")
            links[f"{i}:{rec['T']}:{rec['split']}"] = f"results/{png}"
    return render_recall(long_docs, plot_links=links)


def render_global_keys(doc: dict) -> str:
    """``scripts/global_keys_probe.py``'s table: per corpus, the share of attention on distant keys and what the top
    keys (if visible to every query) hold of it."""
    fr = doc["fractions"]
    head = ["corpus", "attention on distant keys"] + [f"held by top {100 * f:g}% of keys" for f in fr]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, c in doc["corpora"].items():
        lines.append(f"| {name} | {100 * c['distant_share']:.0f}% | "
                     + " | ".join(f"{100 * x:.0f}%" for x in c["held"]) + " |")
    return "\n".join(lines + ["", f"T = {doc['T']}, window {doc['window']}, {doc['sinks']} sink; distant mass "
                              "weighted by layer. Command: `" + doc["command"] + "`"])


def render_partition_oracle(doc: dict) -> str:
    """``scripts/partition_oracle.py``: what the router's top-1 groups keep of the distant attention its global keys
    leave, beside partitions into the same K groups fitted on each window itself, at their budgets, per layer."""
    cols = (("router", "router"), ("symmetric partition", "symmetric"), ("asymmetric partition", "asymmetric"))
    head = ["layer", "global keys hold"] + [f"{n} keeps (budget)" for n, _ in cols]
    lines = [f"Command: `{doc['command']}`", "", f"{len(doc['windows'])} cached target windows, K = {doc['groups']}, "
             f"groups capped at {doc['capacity']:g}x the balanced share; {doc['what']}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(name, r):
        return (f"| {name} | {100 * r['global_share']:.0f}% | " + " | ".join(
            f"{100 * r[k]:.0f}% ({100 * r[k + '_budget']:.0f}%)" for _, k in cols) + " |")

    lines += [row(str(r["layer"]), r) for r in doc["layers"]] + [row("**mean**", doc["mean"])]
    return "\n".join(lines)


def render_partition_imitation(doc: dict) -> str:
    """``scripts/partition_imitation.py``: a router trained to reproduce the partitions fitted on some windows, on
    windows it never saw, beside the shipped router and the partition fitted on those windows with hindsight: the
    share of the distant mass outside the global keys each keeps (its budget), per layer, and on the training
    windows how well the imitator learned them."""
    cols = (("router, uncapped", "eval_router"), ("router, capped (served)", "eval_router_capped"),
            ("imitator, served uncapped", "eval_imitator_served"),
            ("imitator, capped", "eval_imitator_served_capped"), ("fitted (hindsight)", "eval_fitted"))
    head = ["layer"] + [f"{n} keeps (budget)" for n, _ in cols] + ["imitator on its training windows",
                                                                    "agreement train / held-out"]
    kind = f"an MLP of width {doc['hidden']}" if doc.get("hidden") else "linear"
    lines = [f"Command: `{doc['command']}`", "",
             f"Imitator: {kind}; {len(doc['train_windows'])} training and {len(doc['eval_windows'])} held-out cached "
             f"target windows, K = {doc['groups']}, fitted groups capped at {doc['capacity']:g}x the balanced share; "
             f"{doc['what']}.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(name, r):
        return (f"| {name} | " + " | ".join(f"{100 * r[k]:.0f}% ({100 * r[k + '_budget']:.0f}%)" for _, k in cols)
                + f" | {100 * r['train_imitator_served']:.0f}% ({100 * r['train_imitator_served_budget']:.0f}%) | "
                f"{100 * r['train_imitator_agreement']:.0f}% / {100 * r['eval_imitator_agreement']:.0f}% |")

    lines += [row(str(r["layer"]), r) for r in doc["layers"]] + [row("**mean**", doc["mean"])]
    return "\n".join(lines)


def render_imitation_curve(docs: list[dict]) -> str:
    """Learning curve of ``scripts/partition_imitation.py``: one run per training-set size, classifier and input
    (``--context``), the same held-out windows (``--eval-from``) and layers; the means over layers of each run."""
    docs = sorted(docs, key=lambda x: (x.get("context", 0), x.get("hidden", 0), len(x["train_windows"])))
    layers = sorted({r["layer"] for x in docs for r in x["layers"]})
    lines = [f"The same {len(docs[0]['eval_windows'])} held-out windows and layers {', '.join(map(str, layers))} "
             "in every run; means over those layers. Mass: the share of the distant attention outside the global "
             "keys that the top-1 groups keep (budget: the share of a query's distant keys in its group).", "",
             "| imitator | training windows | agreement train / held-out | held-out mass, top-1 uncapped "
             "(budget) | served capped (budget) | router capped | fitted (hindsight) |",
             "|---|---|---|---|---|---|---|"]
    for x in docs:
        m = x["mean"]
        kind = f"MLP {x['hidden']}" if x.get("hidden") else "linear"
        if x.get("context"):  # --context N: the previous N tokens' layer inputs too
            n = x["context"]
            kind += ", + 1 previous token's input" if n == 1 else f", + {n} previous tokens' inputs"
        lines.append(f"| {kind} | {len(x['train_windows'])} | {100 * m['train_imitator_agreement']:.0f}% / "
                     f"{100 * m['eval_imitator_agreement']:.1f}% | {100 * m['eval_imitator']:.1f}% "
                     f"({100 * m['eval_imitator_budget']:.0f}%) | {100 * m['eval_imitator_served_capped']:.1f}% "
                     f"({100 * m['eval_imitator_served_capped_budget']:.0f}%) | {100 * m['eval_router_capped']:.1f}% |"
                     f" {100 * m['eval_fitted']:.1f}% |")
    lines += [""] + [f"- `{x['command']}`" for x in docs]
    return "\n".join(lines)


def render_router_recall(doc: dict) -> str:
    """``scripts/router_recall.py``: each adapter's served top-1 mask, with its cap and uncapped, by the share of the
    original's distant attention it drops and the keys per query it keeps, on each register (one pass per window,
    the same attention for every mask), beside the oracle at the first adapter's budget."""
    corpora = list(dict.fromkeys(r["corpus"] for r in doc["rows"]))
    masks = list(dict.fromkeys(r["mask"] for r in doc["rows"]))
    cell = {(r["corpus"], r["mask"]): r for r in doc["rows"]}
    lines = [f"Command: `{doc['command']}`", "",
             f"T = {doc['length']}, {doc['windows']} validation windows per register; trained on "
             f"{doc.get('trained_on', '?')}; adapters: "
             + "; ".join(f"`{k}` = `{v}`" for k, v in doc["adapters"].items())
             + ". Cells: distant attention dropped (distant keys kept per query).", "",
             "| mask | " + " | ".join(corpora) + " |", "|---|" + "---|" * len(corpora)]
    for m in masks:
        lines.append(f"| {m} | " + " | ".join(
            "—" if (c, m) not in cell else f"{100 * cell[c, m]['dropped_distant']:.1f}% "
            f"({cell[c, m]['keys_per_query']:.0f})" for c in corpora) + " |")
    return "\n".join(lines)


def render_shared_ranking(doc: dict) -> str:
    """``scripts/shared_ranking_probe.py``: per-query rankings of the key groups against one ranking per 64-query
    block (the previous block's mean scores, ``FocusConfig.rank_block``): distant attention dropped and the keyed
    engine's union over the kept pairs."""
    splits = list(doc["splits"])
    masks = list(dict.fromkeys(m for s in splits for m in doc["splits"][s]))
    lines = [f"Command: `{doc['command']}`", "",
             f"Adapter `{doc['adapter']}` at T = {doc['T']}, {doc['windows']} held-out window(s) per split. Cells: "
             "distant attention dropped; union / kept: the pairs of every group some query of a 64-query block "
             "joined over the pairs the mask keeps (what the keyed engine computes per kept pair).", "",
             "| ranking | " + " | ".join(f"dropped {s} | union / kept {s}" for s in splits) + " |",
             "|---|" + "---|---|" * len(splits)]
    for m in masks:
        cells = []
        for s in splits:
            r = doc["splits"][s].get(m)
            cells += ["—", "—"] if r is None else [f"{100 * r['dropped_distant']:.1f}%",
                                                   f"{r['union_over_kept']:.2f}x" if "union_over_kept" in r
                                                   else "—"]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_block_union(doc: dict) -> str:
    """``scripts/block_union_probe.py``: a query's own groups at budget ``b`` against the unions of its block's
    (``FocusConfig.union_block``): distant attention dropped (and the oracle's at the same kept keys), distant keys
    kept per query, and the keys its block computes per query (the keyed engine's cost)."""
    splits = list(doc["splits"])
    masks = [m for m in dict.fromkeys(m for s in splits for m in doc["splits"][s]) if not m.startswith("oracle@")]
    lines = [f"Command: `{doc['command']}`", "",
             f"Adapter `{doc['adapter']}` (served budget {doc['served_budget']:g}) at T = {doc['T']}, "
             f"{doc['windows']} held-out window(s) per register, blocks of {doc['block']} queries. `own@b`: each query "
             "its own groups at budget b; `pre@b`: also those of its block's earlier queries; `pp@b`: and those of "
             "the block before (`union_block`). Cells: distant attention dropped (the oracle's at the same kept "
             "keys) · distant keys kept per query · distant keys computed per query (the block's groups).", "",
             "| mask | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for m in masks:
        cells = []
        for s in splits:
            r, o = doc["splits"][s].get(m), doc["splits"][s].get(f"oracle@{m}")
            cells.append("—" if r is None else
                         f"{100 * r['dropped_distant']:.1f}%"
                         + (f" ({100 * o['dropped_distant']:.1f}%)" if o else "")
                         + f" · {r['keys_per_query']:.0f} · {r.get('computed_per_query', float('nan')):.0f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_floor_probe(doc: dict) -> str:
    """``scripts/floor_probe.py``: the key-space router's routing with a floor under its budget
    (``FocusConfig.min_keys``): per floor and register, distant attention dropped (the oracle's at the same kept
    keys) and distant keys kept per query."""
    splits = list(doc["splits"])
    floors = list(dict.fromkeys(f for s in splits for f in doc["splits"][s]))
    lines = [f"Command: `{doc['command']}`", "",
             f"Adapter `{doc['adapter']}` (budget {doc['budget']:g}, union block {doc['union_block']}) at "
             f"T = {doc['T']}, {doc['windows']} held-out window(s) per register; each query fills at least `min_keys` "
             "of its distant keys (all when fewer). Cells: distant attention dropped (the oracle's at the same kept "
             "keys) · distant keys kept per query.", "",
             "| min_keys | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for f in floors:
        cells = []
        for s in splits:
            r = doc["splits"][s].get(f)
            cells.append("—" if r is None else f"{100 * r['dropped_distant']:.1f}% "
                         f"({100 * r['oracle_dropped_distant']:.1f}%) · {r['keys_per_query']:.0f}")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_key_clusters(doc: dict) -> str:
    """``scripts/key_clusters_probe.py``: ClusterKV-style selection in each layer's own key space (centroids fitted
    per sequence, or once on training text) at the served top-1 mask's budget per query, beside that mask and the
    oracle: distant attention dropped, distant keys kept per query and, when measured, perplexity against the
    original on the same windows."""
    corpora = list(dict.fromkeys(r["corpus"] for r in doc["rows"]))
    cell = {(r["corpus"], r["mask"]): r for r in doc["rows"]}
    masks = [m for m in dict.fromkeys(r["mask"] for r in doc["rows"]) if m != "original"]
    fit = doc["fit"]
    lines = [f"Command: `{doc['command']}`", "",
             f"Adapter `{doc['adapter']}` at T = {doc['length']}, {doc['windows']} validation windows per register; "
             f"`fitted` centroids from {fit['windows']} windows of each of {', '.join(fit['corpora'])} (their train "
             f"splits, {fit['seconds']:.0f} s). "
             "Cells: distant attention dropped (distant keys kept per query)"
             + ("; perplexity change against the original on the same windows." if any("ppl" in r for r in
                                                                                         doc["rows"]) else "."),
             "", "| mask | " + " | ".join(corpora) + " |", "|---|" + "---|" * len(corpora)]

    def show(c: str, m: str) -> str:
        r = cell.get((c, m))
        if r is None:
            return "—"
        out = f"{100 * r['dropped_distant']:.1f}% ({r['keys_per_query']:.0f})"
        base = cell.get((c, "original"), {}).get("ppl")
        if "ppl" in r and base:
            out += f"; {100 * (r['ppl'] / base - 1):+.1f}%"
        return out

    for m in masks:
        lines.append(f"| {m} | " + " | ".join(show(c, m) for c in corpora) + " |")
    if any((c, "original") in cell for c in corpora):
        lines.append("| original perplexity | " + " | ".join(
            f"{cell[c, 'original']['ppl']:.2f}" if (c, "original") in cell else "—" for c in corpora) + " |")
    return "\n".join(lines)


def render_roles(doc: dict) -> str:
    """``scripts/roles_eval.py``: query and key roles (query top-1 / key top-k) beside symmetric top-1 and top-2 on
    one adapter, without retraining: kept pairs, distant attention dropped (and the oracle's at the same budget),
    perplexity, repeat-copy and passkey."""
    names = list(doc["masks"])
    lines = [f"Command: `{doc.get('command')}`", "",
             f"Adapter `{doc['adapter']}` at T = {doc['T']} ({doc['recall_windows']} recall and {doc['ppl_windows']} "
             "perplexity windows per split); masks: " + "; ".join(f"`{k}` = {v}" for k, v in doc["masks"].items()),
             "", "| mask | split | pairs kept | distant attention dropped | oracle, same budget | × oracle | "
             "perplexity vs original |", "|---|---|---|---|---|---|---|"]
    for name in names:
        for split, sd in doc["splits"].items():
            m = sd["masks"][name]
            lines.append(f"| {name} | {split} ({doc['corpora'][split]}) | {100 * m['pairs_kept']:.1f}% | "
                         f"{100 * m['distant_dropped']:.1f}% | {100 * m['distant_dropped_oracle']:.1f}% | "
                         f"{m['vs_oracle']:.1f}× | {100 * m['ppl_change']:+.1f}% |")
    pr = doc.get("probes")
    if pr:
        res = pr["results"]
        lines += ["", f"Probes ({pr['filler']} filler): repeat-copy perplexity / passkey accuracy: "
                  + "; ".join(f"{k} {v['repeat_ppl']:.2f} / {100 * v['passkey']:.0f}%" for k, v in res.items())]
    return "\n".join(lines)


def render_registers(docs: list[dict]) -> str:
    """``long-eval`` runs whose out-of-domain text is another register than news (``--ood-data``; kept in
    ``register_eval*.json`` so the Pareto table's news column is never mixed with it): one row per adapter, length
    and variant, the change against the original of the same run, the passkey hidden in that register's text, and
    the distant attention dropped over the oracle's at the same budget. Why: the routing's clusters were fitted on
    some registers; a register none of them saw is the test of whether what it keeps carries over."""
    lines = ["| adapter | T | register | variant | pairs kept | perplexity, domain | perplexity, register | "
             "repeat-copy | passkey | distant dropped (domain / register) | over the oracle |", "|" + "---|" * 11]
    cmds = []
    for doc in docs:
        name, ood = _adapter_name(doc), doc["corpora"]["ood"]
        for t in sorted({r["T"] for r in doc["results"]}):
            rows = [r for r in doc["results"] if r["T"] == t]
            base = next((r for r in rows if r["variant"] == "original"), None)
            oracle = next((r for r in rows if r["variant"].startswith("oracle@")), None)
            for r in rows:
                def rel(key, r=r):
                    x, b = r.get(key), (base or {}).get(key)
                    if x is None:
                        return "—"
                    return f"{x:.2f}" if r is base or b is None else f"{x:.2f} ({100 * (x / b - 1):+.1f}%)"
                dd, od = r.get("distant_dropped") or {}, (oracle or {}).get("distant_dropped") or {}
                drop = " / ".join(f"{100 * dd[s]:.1f}%" for s in ("domain", "ood") if s in dd) or "—"
                over = ("—" if r is oracle or not dd or not od else
                        " / ".join(f"{dd[s] / od[s]:.2f}x" for s in ("domain", "ood") if s in dd and od.get(s)))
                pk = (r.get("passkey") or {})
                pk = f"{round(pk['accuracy'] * pk['n'])}/{pk['n']}" if "n" in pk else "—"
                kept = "100%" if r is base else (f"{100 * r['budget_pairs_kept']:.0f}%"
                                                 if r.get("budget_pairs_kept") is not None else "—")
                lines.append(f"| {name} | {t} | {ood} | {r['variant']} | {kept} | {rel('ppl_domain')} | "
                             f"{rel('ppl_ood')} | {rel('repeat_ppl')} | {pk} | {drop} | {over} |")
        cmds.append(f"- `{doc['command']}`")
    return "\n".join(lines + ["", "Passkeys are hidden in the register's own text. Commands:", "", *cmds])


def render_key_groups(docs: list[dict], benches: list[dict]) -> str:
    """``scripts/key_groups_probe.py`` runs (``key_groups_k*.json``) as one table: per adapter (its centroids per
    layer), length and variant of the key groups or their scores, the distant attention dropped per register and
    over the oracle's at the served budget, and the groups a query takes; then the whole-model speed of the same
    adapters (``bench-model`` runs kept as ``key_groups_bench_*.json``, so they never enter the Pareto table). Why:
    a finer or adaptive grouping keeps more only if the router and kernels that serve it stay fast."""
    docs = sorted(docs, key=lambda d: (d["T"], d["groups"]))
    corpora = list(dict.fromkeys(c for d in docs for c in d["splits"]))
    lines = ["| centroids | T | variant | " + " | ".join(f"dropped, {c} (over the oracle)" for c in corpora)
             + " | groups a query takes | imbalance |", "|" + "---|" * (5 + len(corpora))]
    for d in docs:
        names = list(dict.fromkeys(n for c in d["splits"] for n in d["splits"][c]))
        for n in names:
            cells = []
            for c in corpora:
                s = d["splits"].get(c, {})
                r, o = s.get(n), s.get("oracle@served")
                cells.append("—" if r is None else f"{100 * r['dropped_distant']:.1f}%" + (
                    f" ({r['dropped_distant'] / o['dropped_distant']:.2f}x)" if o and r is not o else ""))
            first = next((d["splits"][c][n] for c in corpora if n in d["splits"].get(c, {})), {})
            gq = f"{first['groups_per_query']:.1f}" if "groups_per_query" in first else "—"
            im = f"{first['imbalance']:.2f}" if "imbalance" in first else "—"
            lines.append(f"| {d['groups']} | {d['T']} | {n} | " + " | ".join(cells) + f" | {gq} | {im} |")
    lines += ["", "Groups a query takes and imbalance (K x the sum of squared group shares; 1 = equal groups) are "
              f"those of the first register ({corpora[0] if corpora else '—'}). Commands:", ""]
    lines += [f"- `{d['command']}`" for d in docs]
    if benches:
        lines += ["", "Whole model, `bench-model`, the same day on one quiet machine (prefill and a decode step "
                  "against the original in the same run):", "", "| adapter | T | prefill × | decode × | CPU |",
                  "|---|---|---|---|---|"]
        for b in benches:
            for r in b["results"]:
                if r["variant"] != "original":
                    lines.append(f"| `{b['adapter']}` | {r['T']} | {r['prefill_speedup']:.2f}x | "
                                 f"{r['decode_speedup']:.2f}x | {b.get('cpu') or 'not recorded'} |")
        lines += ["", *[f"- `{b['command']}`" for b in benches]]
    return "\n".join(lines)


def render_head_ranks(doc: dict) -> str:
    """``scripts/head_ranks.py``: where the asked heads rank among an adapter's routed heads by measures taken on
    training text only (no evaluation probe), beside each measure's leaders; the copy loss the dense-gain search
    starts from."""
    asked = list(dict.fromkeys(h for m in doc["measures"].values() for h in m["rank"]))
    cmd = doc.get("command") or "make floor32-heads (scripts/head_ranks.py)"
    lines = [f"Command: `{cmd}`", "",
             f"Adapter `{doc['adapter']}` ({len(doc['dense_heads'])} dense heads), T = {doc['length']}, training "
             f"text of {', '.join(doc['corpora'])}. Ranks among the routed key/value heads (1 = first); the leaders "
             "with their scores.", "",
             "| measure | " + " | ".join(f"rank of {h}" for h in asked) + " | first three |",
             "|---|" + "---|" * len(asked) + "---|"]
    for name, m in doc["measures"].items():
        top = ", ".join(f"{h} ({v:.3f})" for h, v in m["top"][:3])
        ranks = " | ".join(f"{m['rank'].get(h, '—')} / {m['routed_heads']}" for h in asked)
        lines.append(f"| {name} | {ranks} | {top} |")
    loss = doc.get("copy_loss")
    if loss:
        best = sorted(loss["layer_gain"].items(), key=lambda kv: -kv[1])[:3]
        lines += ["", f"Copy loss (mean NLL of the second copies): original {loss['original']:.4f}, served "
                  f"{loss['served']:.4f}; the layers whose routed heads, served dense together, save most: "
                  + ", ".join(f"{k} ({v:.4f})" for k, v in best) + "."]
    return "\n".join(lines)
