"""Human-readable tables from result JSON (the CLI prints them; docs/RESULTS.md is generated from them)."""
from __future__ import annotations


def _f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def retrofit_table(s: dict) -> str:
    """Markdown summary of one retrofit ``summary.json``."""
    if s.get("method") == "lora":
        return lora_table(s)
    if s.get("method") in ("lazy", "lazy+lora"):
        return lazy_table(s)
    cfg, par, ppl = s["config"], s["parameters"], s["perplexity"]
    f = cfg["focus"]
    lines = [
        f"model `{cfg['model']}`, data `{cfg['data']}`, {cfg['steps']} steps x {cfg['batch_size'] * cfg['grad_accum']}"
        f" x {cfg['seq_len']} tokens; K={f['num_groups']}, d_g={f['group_dim']}, w={f['window']}, gate={f['gate']}"
        f" (lam={cfg.get('lam_final') or f['lam']}, offset={f['gate_offset']}), routing={f['routing']}, sink tokens="
        f"{f.get('sink_tokens', 0)}" + (f", balance loss {cfg['balance_loss']}" if cfg.get("balance_loss") else "")
        + (f" (lam annealed from {f['lam']})" if cfg.get("lam_final") else ""),
        "",
        f"trainable parameters: {par['router']:,} ({par['percent']:.3f}% of {par['total']:,})",
        "",
        "| split | before | after: soft | " + " | ".join(k.replace("top", "top-") for k in ppl["after"]["domain"]
                                                       if k != "soft") + " |",
        "|---|---|---|" + "---|" * (len(ppl["after"]["domain"]) - 1),
    ]
    for split in ("domain", "ood"):
        if split not in ppl["after"]:
            continue
        a = ppl["after"][split]
        row = [split + (" (" + cfg["ood_data"] + ")" if split == "ood" else " (" + cfg["data"] + ")"),
               _f(ppl["before"].get(split)), _f(a["soft"])] + [_f(v) for k, v in a.items() if k != "soft"]
        lines.append("| " + " | ".join(row) + " |")
    if s.get("pairs_kept"):
        kept = s["pairs_kept"]
        lines.append("| causal pairs kept | 100% | — | " + " | ".join(
            f"{100 * kept[k]:.1f}%" if k in kept else "—" for k in ppl["after"]["domain"] if k != "soft") + " |")
    lines += ["", f"top-k > {f['num_groups'] // 2} needs no column: any two tokens then share a group (two k-subsets "
              f"of {f['num_groups']} groups intersect when 2k > {f['num_groups']}), so it equals the model before."]
    g = s["groups"]
    lines += ["", "per-layer group dominance (share of tokens in the largest group; balanced = "
              f"{1 / f['num_groups']:.3f}) and mean assignment confidence:", "",
              "| layer | " + " | ".join(str(x["layer"]) for x in g) + " |",
              "|---|" + "---|" * len(g),
              "| dominance | " + " | ".join(f"{x['dominance']:.2f}" for x in g) + " |",
              "| confidence | " + " | ".join(f"{x['confidence']:.2f}" for x in g) + " |",
              "", f"adapter: `{s['adapter']}`; wall time {s['wall_seconds'] / 60:.1f} min"]
    return "\n".join(lines)


def _one_mode_rows(cfg: dict, ppl: dict, key: str, label: str) -> list[str]:
    """The before/after perplexity table of a method with one evaluated mode (LoRA, Lazy)."""
    lines = [f"| split | before | after: {label} |", "|---|---|---|"]
    for split in ("domain", "ood"):
        if split in ppl["after"]:
            name = cfg["ood_data"] if split == "ood" else cfg["data"]
            lines.append(f"| {split} ({name}) | {_f(ppl['before'].get(split))} | {_f(ppl['after'][split][key])} |")
    return lines


def lazy_table(s: dict) -> str:
    """Markdown summary of a Lazy retrofit ``summary.json`` (``focusattn retrofit --method lazy``)."""
    cfg, par, ppl, lz = s["config"], s["parameters"], s["perplexity"], s["lazy"]
    e = cfg["lazy"]
    lora = f" + LoRA r={cfg['lora_rank']} on q,k" if s["method"] == "lazy+lora" else ""
    tau = [x for layer in lz["tau"] for x in layer]
    att = lz["attention"]
    lines = [
        f"model `{cfg['model']}`, data `{cfg['data']}`, {cfg['steps']} steps x {cfg['batch_size'] * cfg['grad_accum']}"
        f" x {cfg['seq_len']} tokens; Elastic-Softmax, tau from {e['tau_init']:g} ({e['tau_mode']}"
        f"{', trained' if e['train_tau'] else ', frozen'}){', distance table' if e['use_bias'] else ''}{lora}",
        "",
        f"trainable parameters: {par['trainable']:,} ({par['percent']:.3f}% of {par['total']:,}); tau after "
        f"training: mean {sum(tau) / len(tau):.3g}, min {min(tau):.3g}, max {max(tau):.3g}",
        "",
    ] + _one_mode_rows(cfg, ppl, "lazy", "Lazy")
    u = att["uniform_sink_mass"]
    lines += ["", f"exact zeros {100 * att['mean']['sparsity']:.1f}% of causal pairs; surviving mass "
              f"{att['mean']['surviving_mass']:.3f}; first-token share {att['mean']['sink_share'] / u:.1f}x uniform "
              f"(largest layer {max(att['per_layer']['sink_share']) / u:.1f}x)",
              "", f"adapter: `{s['adapter']}`; wall time {s['wall_seconds'] / 60:.1f} min"]
    return "\n".join(lines)


def lora_table(s: dict) -> str:
    """Markdown summary of a LoRA-baseline ``summary.json`` (``focusattn retrofit --method lora``)."""
    cfg, par, ppl = s["config"], s["parameters"], s["perplexity"]
    alpha = cfg.get("lora_alpha") or 2 * cfg["lora_rank"]
    lines = [
        f"model `{cfg['model']}`, data `{cfg['data']}`, {cfg['steps']} steps x {cfg['batch_size'] * cfg['grad_accum']}"
        f" x {cfg['seq_len']} tokens; LoRA r={cfg['lora_rank']}, alpha={alpha:g} on the attention projections",
        "",
        f"trainable parameters: {par['trainable']:,} ({par['percent']:.3f}% of {par['total']:,})",
        "",
    ] + _one_mode_rows(cfg, ppl, "lora", "LoRA")
    lines += ["", f"adapter (peft format): `{s['adapter']}`; wall time {s['wall_seconds'] / 60:.1f} min"]
    return "\n".join(lines)
