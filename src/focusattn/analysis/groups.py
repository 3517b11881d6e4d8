"""Group statistics of a composed model: dominance (share of tokens in the largest group; 1/K is balanced), mean
assignment confidence (mean of each token's largest group probability), group sizes per layer, and the share of
causal pairs that hard top-k routing keeps (the sparsity that inference actually gets); what the groups hold (a table
per chosen layer: share, frequent tokens with purity, examples in context) and how stable each token's group is
between two checkpoints or adapters (``focusattn groups``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..focus.attend import served_sinks
from ..hf.compose import last_routing, routers
from ..kernels.common import sink_key_mask
from ..kernels.reference import focus_allowed


def _with_dense(model, layer: int, t: int, kept: float) -> float:
    """Kept pairs of ``layer`` with its dense heads (``FocusConfig.dense_heads``) keeping every causal pair."""
    from ..hf.compose import dense_share

    d = dense_share(model, layer)
    return d * t * (t + 1) / 2 + (1 - d) * kept


def _served_kept(model, w) -> float:
    """Pairs the hard top-1 mask keeps on window ``w``, summed over layers: one forward at top-1, then back to the
    model's own setting (a query projection's groups are hard memberships only in the served routing)."""
    from ..hf import focus_config, set_top_k

    before = focus_config(model).top_k
    set_top_k(model, 1)
    try:
        model(torch.as_tensor(np.asarray(w)[None], dtype=torch.long, device=next(model.parameters()).device))
        t, total = w.shape[-1], 0
        for i, (r, routing) in enumerate(zip(routers(model), last_routing(model))):
            sinks = sink_key_mask(t, served_sinks(routing, r.cfg, t, device=routing.membership.device),
                                  device=routing.membership.device)
            total += _with_dense(model, i, t, focus_allowed(routing.membership, r.cfg.window, t, sinks,
                                                            routing.query_membership).sum().item())
        return total
    finally:
        set_top_k(model, before)


@torch.no_grad()
def group_stats(model, windows: np.ndarray, top_ks=(), roles=()) -> dict:
    """Run ``windows`` [N, T] through the composed model (soft mode, eval) and summarise every layer's routing.

    Returns ``{"layers": [...], "pairs_kept": {"top1": share, ...}}``; pairs are counted over all layers and windows
    with the model's window and sink settings, as a share of all causal pairs. ``roles``: key top-ks served with
    query top-1 (query and key roles), counted as ``"top1key{k}"``.
    """
    import dataclasses

    from ..focus.config import FocusConfig
    from ..focus.router import hard_memberships, served_memberships

    model.eval()
    device = next(model.parameters()).device
    rs = routers(model)
    counts = [None] * len(rs)
    conf = [0.0] * len(rs)
    kept = {f"top{k}": 0 for k in top_ks} | {f"top1key{k}": 0 for k in roles}
    causal_pairs = 0
    n = 0
    for w in windows:
        model(torch.as_tensor(np.asarray(w)[None], dtype=torch.long, device=device))
        t = w.shape[-1]
        routings = last_routing(model)
        for i, r in enumerate(rs):
            g = routings[i].groups.float()  # [1, T, K]
            flat = g.reshape(-1, r.cfg.num_groups)
            c = torch.bincount(flat.argmax(-1), minlength=r.cfg.num_groups).cpu()
            counts[i] = c if counts[i] is None else counts[i] + c
            conf[i] += flat.max(-1).values.sum().item()
            sinks = sink_key_mask(t, served_sinks(routings[i], r.cfg, t, device=device), device=device)
            for k in top_ks:
                if r.cfg.query_proj:  # the queries' groups come from their own projection: counted below, served
                    continue
                member = served_memberships(g, dataclasses.replace(r.cfg, top_k=k, key_top_k=None))[0]
                kept[f"top{k}"] += _with_dense(model, i, t, focus_allowed(member, r.cfg.window, t, sinks).sum().item())
            for k in roles:
                km, qm = hard_memberships(g, FocusConfig(num_groups=r.cfg.num_groups, top_k=1, key_top_k=k))
                qm = km if qm is None else qm
                kept[f"top1key{k}"] += _with_dense(model, i, t,
                                                   focus_allowed(km, r.cfg.window, t, sinks, qm).sum().item())
            causal_pairs += t * (t + 1) // 2
        if rs and rs[0].cfg.query_proj and 1 in top_ks:  # query top-1 of its own scores vs key top-k, as served
            kept["top1"] += _served_kept(model, w)
        n += w.shape[-1]
    layers = []
    for i, c in enumerate(counts):
        share = (c.float() / c.sum()).tolist()
        layers.append({"layer": i, "dominance": max(share), "confidence": conf[i] / n, "group_share": share})
    return {"layers": layers, "pairs_kept": {n: v / causal_pairs for n, v in kept.items()}}


@torch.no_grad()
def assignments(model, windows: np.ndarray, layers: list[int]) -> dict[int, np.ndarray]:
    """Each token's group (argmax of the soft assignment) in each of ``layers``: ``{layer: int array [N, T]}``."""
    model.eval()
    device = next(model.parameters()).device
    out = {li: [] for li in layers}
    for w in windows:
        model(torch.as_tensor(np.asarray(w)[None], dtype=torch.long, device=device))
        routings = last_routing(model)
        for li in layers:
            out[li].append(routings[li].groups[0].argmax(-1).cpu().numpy())
    return {li: np.stack(v) for li, v in out.items()}


def top_tokens(model, tokenizer, windows: np.ndarray, layers: list[int], per_group: int = 8) -> dict:
    """Most frequent tokens assigned (argmax) to each group, per requested layer: what the groups *mean*."""
    k = routers(model)[0].cfg.num_groups
    ids = np.asarray(windows)
    out = {}
    for li, arg in assignments(model, windows, layers).items():
        out[str(li)] = [[[tokenizer.decode([int(t)]), int(c)] for t, c in _counts(ids[arg == g])[:per_group]]
                        for g in range(k)]
    return out


def _counts(ids: np.ndarray) -> list[tuple[int, int]]:
    """(token id, count), most frequent first (ties by id: deterministic)."""
    u, c = np.unique(ids, return_counts=True)
    order = np.lexsort((u, -c))
    return [(int(u[i]), int(c[i])) for i in order]


def group_table(ids: np.ndarray, arg: np.ndarray, k: int, tokenizer, *, per_group: int = 8, examples: int = 3,
                context: int = 8) -> list[dict]:
    """One layer's groups: what each holds. ``ids``, ``arg``: token ids and their groups, both [N, T].

    share: the group's share of the tokens (1/K balanced). Per frequent token: ``count`` in the group and ``purity``
    = the share of that token's occurrences (anywhere) routed to this group (1 = the token type always goes here).
    purity (group): the mean token purity over the group's tokens; if routing ignored which token it is, it would
    equal the group's share (``purity_chance``), so purity well above share means the group is about *tokens*,
    near share means it is about position or context. examples: occurrences in context (``context`` tokens before, half as many after), the token in [[ ]].
    """
    ids = np.asarray(ids)
    flat_ids, flat_arg = ids.reshape(-1), arg.reshape(-1)
    n = flat_ids.size
    vocab = int(flat_ids.max()) + 1
    total = np.bincount(flat_ids, minlength=vocab)  # occurrences of each token type
    out = []
    for g in range(k):
        where = flat_arg == g
        n_g = int(where.sum())
        row = {"group": g, "share": n_g / n, "tokens": [], "purity": None, "purity_chance": n_g / n, "examples": []}
        if n_g:
            in_g = np.bincount(flat_ids[where], minlength=vocab)
            row["purity"] = float((in_g.astype(float) ** 2 / np.maximum(total, 1)).sum() / n_g)
            row["tokens"] = [{"token": tokenizer.decode([t]), "count": c, "purity": c / int(total[t])}
                             for t, c in _counts(flat_ids[where])[:per_group]]
            pos = np.argwhere(arg == g)  # (window, position), evenly spaced picks over the group's occurrences
            for j in np.linspace(0, len(pos) - 1, min(examples, len(pos))).round().astype(int):
                seq, t = ids[int(pos[j][0])], int(pos[j][1])
                piece = lambda xs: "".join(tokenizer.decode([int(x)]) for x in xs)  # noqa: E731 (token by token)
                row["examples"].append(f"{piece(seq[max(0, t - context):t])}[[{piece(seq[t:t + 1])}]]"
                                       f"{piece(seq[t + 1:t + 1 + context // 2])}")
        out.append(row)
    return out


def stability(arg_a: np.ndarray, arg_b: np.ndarray, k: int) -> dict:
    """Share of tokens that keep their group between two routings of the same text (two checkpoints or adapters).

    ``same_index``: the group number is unchanged (meaningful between checkpoints of one run). ``matched``: after
    the one-to-one relabelling of B's groups that maximises agreement (Hungarian), for routers trained apart, whose
    group numbers are arbitrary. Chance for independent balanced routings is 1/K.
    """
    a, b = arg_a.reshape(-1), arg_b.reshape(-1)
    conf = np.zeros((k, k), dtype=np.int64)
    np.add.at(conf, (a, b), 1)
    try:
        from scipy.optimize import linear_sum_assignment

        r, c = linear_sum_assignment(-conf)
        matched = float(conf[r, c].sum() / a.size)
    except ImportError:  # scipy is optional: greedy matching (a lower bound of the optimum)
        m, used_r, used_c = 0, set(), set()
        for i in np.argsort(-conf, axis=None):
            x, y = divmod(int(i), k)
            if x not in used_r and y not in used_c:
                m += int(conf[x, y])
                used_r.add(x)
                used_c.add(y)
        matched = m / a.size
    return {"same_index": float((a == b).mean()), "matched": matched, "chance": 1 / k, "tokens": int(a.size)}


def _load_routed(model_spec: str, adapter: str, like=None):
    """A model with ``adapter`` loaded. ``adapter``: a Focus adapter (name, folder, run folder) or a retrofit
    ``checkpoint.pt`` (routers of an intermediate step; its configuration comes from ``like``'s adapter)."""
    from ..hf.io import load_adapter, load_adapter_state, read_adapter_config
    from ..hf.loading import load_model
    from ..train.checkpoint import load_checkpoint

    model, tok = load_model(model_spec)
    if str(adapter).endswith((".pt", "checkpoint.json")):  # a run's checkpoint: its folder holds the verified record
        if like is None:
            raise ValueError(f"{adapter}: a checkpoint is compared with an adapter (--adapter), not used alone")
        from ..adapters import resolve
        from ..focus.config import FocusConfig
        from ..hf.compose import compose

        compose(model, FocusConfig.from_dict(read_adapter_config(resolve(like))["focus_config"]))
        load_adapter_state(model, load_checkpoint(Path(adapter).parent)["trainable"], source=f"checkpoint {adapter}")
    else:
        from ..adapters import resolve

        meta = read_adapter_config(resolve(adapter))  # a Lazy or LoRA adapter has no groups: named, one line
        if meta["focus_config"].get("router_input", "hidden") == "keys":
            raise ValueError(f"adapter {adapter} routes by the layer's keys (router_input='keys'): it has no soft groups "
                             "to report; measure it with `focusattn long-eval --recall-windows N`")
        load_adapter(model, adapter)
    return model, tok


def routing_recall(model, windows: np.ndarray, top_ks, roles=()) -> dict:
    """What the served masks keep of the original model's attention on the same windows, beside the oracle at each
    mask's budget: :func:`..eval.recall.measure_recall` (what ``long-eval --recall-windows`` reports, same fields). A
    router with its own query projection serves query top-1 only, so only top-1 is measured for it."""
    from ..eval.recall import measure_recall

    ks = (1,) if routers(model)[0].cfg.query_proj else tuple(top_ks)
    return measure_recall(model, windows, top_ks=ks, roles=tuple(roles), kmeans=False, desc="recall")


def groups_report(model_spec: str, adapter: str, data: str, *, seq_len: int, windows: int, top_ks, layers,
                  compare: str | None = None, per_group: int = 8, examples: int = 3,
                  command: str | None = None, roles=()) -> dict:
    """Load a base model plus a saved adapter and measure its routing on held-out data: statistics, a table per
    chosen layer (share, frequent tokens with purity, examples in context) and, with ``compare`` (a second adapter
    or a ``checkpoint.pt``), the stability of each token's group between the two."""
    from ..data.corpora import load_corpus
    from ..data.tokens import eval_windows, tokenize

    model, tok = _load_routed(model_spec, adapter)
    other = _load_routed(model_spec, compare, like=adapter)[0] if compare else None  # bad input fails before work
    _, val = tokenize(load_corpus(data), tok, tokenizer_id=model_spec)
    w = eval_windows(val, seq_len, windows)
    n_layers = len(routers(model))
    k_max = routers(model)[0].cfg.num_groups
    top_ks = list(top_ks or range(1, max(1, k_max // 2) + 1))
    layers = list(layers) if layers else [0, n_layers // 2, n_layers - 1]
    bad = [li for li in layers if not 0 <= li < n_layers]
    if bad:
        raise ValueError(f"--layers {bad}: the model has layers 0..{n_layers - 1}")
    bad = [k for k in roles if not 1 <= k <= k_max]
    if bad:
        raise ValueError(f"--key-top-k {bad}: allowed integers in 1..{k_max} (key top-k with query top-1)")
    stats = group_stats(model, w, top_ks, roles)
    recall = routing_recall(model, w, top_ks, roles)
    arg = assignments(model, w, layers)
    tables = {str(li): group_table(w, arg[li], k_max, tok, per_group=per_group, examples=examples) for li in layers}
    res = {"command": command, "model": model_spec, "adapter": str(adapter), "data": data, "seq_len": seq_len,
           "windows": windows, "num_groups": k_max, **stats, "recall": recall,
           "top_tokens": {li: [[[t["token"], t["count"]] for t in row["tokens"]] for row in rows]
                          for li, rows in tables.items()},
           "tables": tables}
    if other is not None:
        if routers(other)[0].cfg.num_groups != k_max:
            raise ValueError(f"--compare {compare}: K={routers(other)[0].cfg.num_groups}, but the adapter has "
                             f"K={k_max}")
        arg_b = assignments(other, w, layers)
        res["compare"] = str(compare)
        res["stability"] = {str(li): stability(arg[li], arg_b[li], k_max) for li in layers}
    return res


def render_markdown(res: dict, *, max_tokens: int = 6) -> str:
    """The group-interpretability section of one ``groups.json``."""
    k = res.get("num_groups") or len(next(iter(res["tables"].values())))
    lines = [f"Adapter `{res['adapter']}` on `{res['data']}` ({res['windows']} windows x {res['seq_len']} tokens). "
             f"Per group: share of tokens (balanced 1/{k} = {1 / k:.3f}); purity = mean over the group's tokens of "
             "the share of that token type's occurrences routed to this group (if routing ignored the token it "
             "would equal the group's share; higher = the group is about token identity); the most frequent tokens "
             "as `token` count (that token's purity); one example in context, the token in [[ ]].", ""]
    for li, rows in res.get("tables", {}).items():
        lines += [f"**Layer {li}**", "", "| group | share | purity | most frequent tokens (purity) | example |",
                  "|---|---|---|---|---|"]
        for r in rows:
            toks = " ".join(f"`{_md(t['token'])}` {t['count']} ({t['purity']:.2f})" for t in r["tokens"][:max_tokens])
            ex = _md(r["examples"][0]) if r["examples"] else "—"
            pur = "—" if r["purity"] is None else f"{r['purity']:.2f}"
            lines.append(f"| G{r['group']} | {r['share']:.3f} | {pur} | {toks} | {ex} |")
        lines.append("")
    if res.get("recall"):
        lines += _recall_lines(res["recall"])
    if res.get("stability"):
        lines += [f"Stability against `{res['compare']}` (share of tokens keeping their group; chance {1 / k:.3f}):",
                  "", "| layer | same group number | after best relabelling |", "|---|---|---|"]
        lines += [f"| {li} | {x['same_index']:.3f} | {x['matched']:.3f} |" for li, x in res["stability"].items()]
        lines.append("")
    lines.append(f"Command: `{res.get('command')}`")
    return "\n".join(lines)


def _recall_lines(rec: dict) -> list[str]:
    """The attention-recall tables: pooled over layers (as in RESULTS), then each layer's distant share and drops."""
    from .recall_report import mask_order, masks_table

    sh = rec["overall"]["share"]
    names = sorted(rec["overall"]["masks"], key=mask_order)
    lines = [f"Attention recall ({rec['windows']} windows x {rec['T']} tokens): the original model puts "
             f"{sh['local']:.0%} of its attention on the window, {sh['sink']:.0%} on the sinks and {sh['distant']:.0%} "
             "on distant keys (mean over layers); each mask's share of that distant attention dropped, pooled over "
             "layers, beside the oracle (as many distant keys per query, the most attended).", "",
             *masks_table(rec["overall"]["masks"]),
             "", "| layer | distant share | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for i, lay in enumerate(rec["layers"]):
        cells = " | ".join(f"{lay['masks'][n]['dropped_distant']:.1%}" for n in names)
        lines.append(f"| {i} | {lay['share']['distant']:.1%} | {cells} |")
    return lines + [""]


def _md(text: str) -> str:
    """A token or snippet safe inside a markdown table cell and backticks (newlines shown as ⏎)."""
    return text.replace("\n", "⏎").replace("|", "\\|").replace("`", "'")
