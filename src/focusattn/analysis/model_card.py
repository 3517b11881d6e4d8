"""Ship a trained adapter inside the package: copy the adapter files under ``focusattn/adapters/NAME/`` and write its
model card (how it was trained, the command, its measured tables), all read from the run's JSON."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from .._errors import InputError
from .._io import write_json, write_text
from ..focus.config import FocusConfig
from ..adapters import HERE
from ..bench.report import render_model_markdown
from ..eval.longctx import budget_matched
from ..hf.io import CONFIG, WEIGHTS, verify_adapter
from .pareto import render_pareto
from .report import retrofit_table


def _need(path: Path, made_by: str) -> dict:
    if not path.is_file():
        raise InputError("run", str(path.parent), f"missing {path.name} (written by `{made_by}`)")
    return json.loads(path.read_text())


def _paths(long_eval) -> list:
    return [long_eval] if isinstance(long_eval, (str, Path)) else list(long_eval)


def _long_evals(long_eval) -> list[dict] | None:
    """One or more long_eval.json paths (a re-measured baseline beside the adapter's run: rows merge by
    configuration), read with older k-means rows renamed (:func:`..eval.longctx.budget_matched`)."""
    if not long_eval:
        return None
    return [budget_matched(_need(Path(p), "focusattn long-eval")) for p in _paths(long_eval)]


def _measured(le: list[dict] | None, mb: dict | None) -> list[str]:
    """A card's measured tables (long-eval, model bench), as lines after its account of how it was made."""
    lines = []
    if le:
        lines += ["", MEASURED[0], "", render_pareto(le, [mb] if mb else [])]
    if mb is not None:
        lines += ["", MEASURED[1], "", render_model_markdown(mb, plot_link="").replace("![model bench]()", "")]
    return lines


def _usage_and_command(model: str, load: str, command: str, long_eval, model_bench) -> list[str]:
    """A derived adapter's card lines: the Python that loads it (``load``), then the command that made it."""
    return ["```python", "import focusattn as fa", f'model, tok = fa.load_model("{model}")', load, "```", "",
            "Made by:", "", f"`{command}"
            + (f" --long-eval {' '.join(map(str, _paths(long_eval)))}" if long_eval else "")
            + (f" --model-bench {model_bench}" if model_bench else "") + "`"]


def _finish(tmp: Path, out: Path, lines: list[str], le: list[dict] | None, mb: dict | None) -> Path:
    """Add the measured tables to the card, write it, and put the folder in place (replacing an older one)."""
    write_text(tmp / "README.md", "\n".join(lines + _measured(le, mb)) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


MEASURED = ("## Long context: quality against the original model and baselines", "## Whole-model speed")


def refresh_card(name: str, *, long_eval=None, model_bench=None, dest: Path | None = None) -> Path:
    """Re-render the measured tables of shipped adapter ``name``'s card from new JSON (a re-measurement after a
    kernel change), keeping its tensors, config and the card's account of how it was made: the training run is not
    needed. Written atomically (a crash leaves the old card)."""
    if not long_eval and not model_bench:
        raise InputError("long-eval", "", "--refresh-card needs --long-eval and/or --model-bench")
    card = (dest or HERE) / name / "README.md"
    if not card.is_file():
        raise InputError("run", name, f"no shipped adapter card at {card}")
    lines = card.read_text().splitlines()
    head = next((i for i, line in enumerate(lines) if line in MEASURED), len(lines))
    le = _long_evals(long_eval)
    mb = _need(Path(model_bench), "focusattn bench-model") if model_bench else None
    while head and not lines[head - 1].strip():
        head -= 1
    write_text(card, "\n".join(lines[:head] + _measured(le, mb)).rstrip("\n") + "\n")
    return card.parent


def ship_adapter(run_dir, name: str, *, long_eval=None, model_bench=None, dest: Path | None = None,
                 rebalance: int | None = None, rebalance_warm: bool | None = None, dense_heads: str | None = None,
                 capacity: float | None = None, first_phase=None) -> Path:
    """``run_dir``: a ``focusattn retrofit --out`` folder (``summary.json`` + ``adapter/``). Returns the new folder.
    ``rebalance`` / ``rebalance_warm`` / ``capacity`` / ``dense_heads`` (a ``--dense-heads`` spec; scored heads
    are measured on the run's model): ship the adapter with these inference settings (see FocusConfig), not the ones it was saved
    with.
    ``first_phase``: the retrofit folder the run continued from (``--init-adapter``), so the card gives both
    commands: the adapter cannot be rebuilt from the last one alone."""
    from ..hf.heads import describe, parse_dense_heads

    run = Path(run_dir)
    summary = _need(run / "summary.json", "focusattn retrofit --out RUN")
    first = _need(Path(first_phase) / "summary.json", "focusattn retrofit --out RUN") if first_phase else None
    if summary.get("method", "focus") != "focus":
        raise InputError("run", str(run), f"a {summary['method']} run (`retrofit --method {summary['method']}`): "
                         "ship-adapter ships Focus adapters; a LoRA adapter is used with peft directly")
    for f in (CONFIG, WEIGHTS):
        if not (run / "adapter" / f).is_file():
            raise InputError("run", str(run), f"missing adapter/{f} (written by `focusattn retrofit --out RUN`)")
    verify_adapter(run / "adapter")  # ship only a complete adapter whose tensors match its checksum
    if not name or "/" in name or name.startswith("."):
        raise InputError("name", name, "a plain folder name, e.g. smollm2-135m-focus-k8")
    le = _long_evals(long_eval)
    mb = _need(Path(model_bench), "focusattn bench-model") if model_bench else None
    spec = None if dense_heads is None else parse_dense_heads(dense_heads)  # bad input fails before any work
    scored = None  # scored heads: measured on the run's model with these routers, before anything is written
    if isinstance(spec, dict):
        scored = _scored(summary["config"]["model"], run / "adapter", spec)
    acfg = json.loads((run / "adapter" / CONFIG).read_text())
    over = {k: v for k, v in (("rebalance", None if rebalance is None else int(rebalance)),
                              ("rebalance_warm", rebalance_warm),
                              ("capacity", None if capacity is None else float(capacity))) if v is not None}
    if spec is not None:  # named pairs, or the scored ones: validated with the rest of the config
        over["dense_heads"] = spec if scored is None else scored
    if over:  # validated before anything is written
        acfg["focus_config"] = FocusConfig.from_dict({**acfg["focus_config"], **over}).to_dict()
    out = (dest or HERE) / name
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in (CONFIG, WEIGHTS):
        shutil.copy2(run / "adapter" / f, tmp / f)
    served = ""
    # a shipped adapter always carries its tensors' checksum (runs saved before checksums existed have none)
    acfg["weights_sha256"] = hashlib.sha256((tmp / WEIGHTS).read_bytes()).hexdigest()
    cfg = summary["config"]
    write_json(tmp / CONFIG, acfg)
    if rebalance is not None and cfg["focus"].get("rebalance") == rebalance:
        served = (f" Trained and shipped with online rebalancing every {rebalance} tokens (`FocusConfig.rebalance`: "
                  "groups stay balanced on text unlike the training corpus); `focusattn.hf.update_config(model, rebalance=0)` "
                  "serves the learned offsets alone.")
    elif rebalance is not None:
        served = (f" Shipped with online rebalancing every {rebalance} tokens (`FocusConfig.rebalance`, an inference "
                  "setting not used in training: groups stay balanced on text unlike the training corpus); "
                  "`focusattn.hf.update_config(model, rebalance=0)` serves the learned offsets alone.")
    if rebalance_warm:
        served += (" Served with warm-started rebalancing (`FocusConfig.rebalance_warm`: each re-estimate starts "
                   "from the previous one, so the groups stay balanced on sharp router logits).")
    if capacity:
        served += (f" Served with group sizes capped at {float(capacity):g}x the balanced share (`FocusConfig.capacity`: "
                   "a token does not join a group that already holds more of the earlier tokens, so no text puts "
                   "most tokens in one group; the run's own tables below are without it).")
    if dense_heads is not None:
        heads = acfg["focus_config"]["dense_heads"]
        listed = ", ".join(f"{a}:{b}" for a, b in heads)
        chosen = describe(spec) if isinstance(spec, dict) else "the key/value heads named"
        served += (f" Served with {len(heads)} dense heads (`--dense-heads {dense_heads}`: {chosen}), layer:head "
                   f"`{listed}`: those heads keep full causal attention, the rest of each layer the routed mask "
                   "(`FocusConfig.dense_heads`, docs/DESIGN.md \"Dense heads\").")
    lines = [f"# {name}", "",
             f"A Focus adapter for `{cfg['model']}`: {summary['parameters']['router']:,} router parameters "
             f"({summary['parameters']['percent']:.2f}% of the model), every pretrained weight frozen.", "",
             "```python", "import focusattn as fa", f'model, tok = fa.load_model("{cfg["model"]}")',
             f'fa.load_adapter(model, "{name}"); fa.set_top_k(model, 1)   # hard top-1: the exact sparse kernels',
             "```", "", "## How it was trained", ""]
    minutes = summary["wall_seconds"] / 60
    if first is not None:
        minutes += first["wall_seconds"] / 60
        lines += [f"Two runs. First: `{first.get('command')}`", "",
                  f"then, continuing from its adapter: `{summary.get('command')}`", ""]
    elif cfg.get("init_adapter"):
        lines += [f"`{summary.get('command')}` (continued from the adapter `{cfg['init_adapter']}`)", ""]
    else:
        lines += [f"`{summary.get('command')}`", ""]
    extra = ""
    if cfg.get("distill"):
        extra += f", distilled from the original model (weight {cfg['distill']})"
    if cfg.get("repeat_prob"):
        extra += f", {cfg['repeat_prob']:.0%} of the windows with a repeated second half"
    lead = "Last run: " if first is not None or cfg.get("init_adapter") else ""
    lines += [f"{lead}{cfg['seq_len']} tokens per window{extra}; balance loss weight {cfg.get('balance_loss', 0)}, "
              f"gate sharpness lambda = {cfg.get('lam_final') or cfg['focus']['lam']} at the end; {minutes:.0f} min "
              f"on 2 CPU cores in all.{served}",
              "", "## Perplexity at the training length", "", retrofit_table(summary)]
    flags = [f"--rebalance {rebalance}" if rebalance is not None else "", "--rebalance-warm" if rebalance_warm else "",
             f"--capacity {float(capacity):g}" if capacity is not None else "",
             f"--dense-heads {dense_heads}" if dense_heads is not None else "",
             f"--first-phase {first_phase}" if first_phase else ""]
    if any(flags):  # the serving settings are the shipper's: the card says how to ship them again
        at = lines.index("## Perplexity at the training length") - 1
        lines[at:at] = ["", f"Shipped by: `focusattn ship-adapter {run_dir} --name {name} {' '.join(f for f in flags if f)}`"]
    return _finish(tmp, out, lines, le, mb)


def _serve_changes(budget, key_scores, union_block, min_keys, dense_heads=None) -> dict:
    """The key-space serving fields a ship command sets (None: the source's), in the order the flags are printed;
    ``dense_heads``: (layer, kv_head) pairs."""
    return {k: v for k, v in (("budget", None if budget is None else float(budget)), ("key_scores", key_scores),
                              ("union_block", union_block), ("min_keys", min_keys),
                              ("dense_heads", None if dense_heads is None else tuple(map(tuple, dense_heads))))
            if v is not None}


def _serve_flags(changes: dict) -> str:
    """``changes`` as the ``ship-adapter`` flags that set them (``--budget 0.04 --union-block 64``)."""
    def value(v):
        if isinstance(v, tuple):
            return ",".join(f"{a}:{b}" for a, b in v)
        return f"{v:g}" if isinstance(v, float) else v

    return " ".join(f"--{k.replace('_', '-')} {value(v)}" for k, v in changes.items())


def ship_key_adapter(run_dir, name: str, *, budget: float | None = None, key_scores: str | None = None,
                     union_block: int | None = None, min_keys: int | None = None, long_eval=None, model_bench=None,
                     dest: Path | None = None) -> Path:
    """``run_dir``: a ``focusattn fit-keys --out`` folder (``summary.json`` + ``adapter/``): its centroids shipped
    as ``name``, served at ``budget`` (``FocusConfig.budget``; None = the one it was fitted with: the centroids do
    not depend on it), with a card saying how they were fitted and the measured tables."""
    run = Path(run_dir)
    summary = _need(run / "summary.json", "focusattn fit-keys --out RUN")
    for f in (CONFIG, WEIGHTS):
        if not (run / "adapter" / f).is_file():
            raise InputError("run", str(run), f"missing adapter/{f} (written by `focusattn fit-keys --out RUN`)")
    verify_adapter(run / "adapter")
    if not name or "/" in name or name.startswith("."):
        raise InputError("name", name, "a plain folder name, e.g. smollm2-135m-focus-keys64")
    le = _long_evals(long_eval)
    mb = _need(Path(model_bench), "focusattn bench-model") if model_bench else None
    acfg = json.loads((run / "adapter" / CONFIG).read_text())
    changes = _serve_changes(budget, key_scores, union_block, min_keys)
    if changes:  # validated before anything is written
        acfg["focus_config"] = FocusConfig.from_dict({**acfg["focus_config"], **changes}).to_dict()
    fc = acfg["focus_config"]
    out = (dest or HERE) / name
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in (CONFIG, WEIGHTS):
        shutil.copy2(run / "adapter" / f, tmp / f)
    acfg["weights_sha256"] = hashlib.sha256((tmp / WEIGHTS).read_bytes()).hexdigest()
    write_json(tmp / CONFIG, acfg)
    cfg = summary["config"]
    heads = fc.get("dense_heads") or []
    share = max(summary.get("largest_cluster_share", {}).values(), default=None)
    lines = [f"# {name}", "",
             f"A key-space Focus adapter for `{cfg['model']}` (`FocusConfig.router_input=\"keys\"`): "
             f"{fc['num_groups']} centroids per layer in the layer's own key space (after RoPE, the key/value heads "
             f"side by side; {fc['num_groups'] * fc['group_dim'] * acfg['num_layers']:,} numbers in all), fitted by "
             "k-means on the frozen model's keys; nothing is trained by gradient and every pretrained weight is "
             "unchanged. Each key joins its nearest centroid's group; each query joins the groups its "
             "key/value-group-mean query scores highest until they hold "
             f"{fc['budget']:.0%} of its distant keys (beyond the {fc['window']}-token window, after "
             f"{fc['sink_tokens']} sink). Served exactly by the sparse kernels (decode = prefill)"
             + (f", with {len(heads)} dense key/value heads (layer:head "
                f"`{', '.join(f'{a}:{b}' for a, b in heads)}`: full causal attention)" if heads else "") + ".", "",
             "```python", "import focusattn as fa", f'model, tok = fa.load_model("{cfg["model"]}")',
             f'fa.load_adapter(model, "{name}")   # fa.hf.update_config(model, budget=0.15): more keys, slower',
             "```", "", "## How it was fitted", "", f"`{summary.get('command')}`", "",
             f"{summary['keys_per_layer']:,} keys per layer ({cfg['windows']} window(s) of {summary['length']} tokens "
             f"of each of {', '.join(cfg['corpora'])}, training splits), {summary['fit_seconds'] / 60:.0f} min on one "
             "CPU core" + (f"; the largest cluster held {share:.0%} of a layer's keys" if share is not None else "")
             + "."]
    if changes:
        lines += ["", f"Shipped by: `focusattn ship-adapter {run_dir} --name {name} {_serve_flags(changes)}` "
                  f"(fitted with budget {summary['focus_config']['budget']:g}; the centroids do not depend on it)."]
    return _finish(tmp, out, lines, le, mb)


def derive_key_adapter(source: str, name: str, *, budget: float | None = None, key_scores: str | None = None,
                       union_block: int | None = None, min_keys: int | None = None, dense_heads: str | None = None,
                       long_eval=None, model_bench=None, dest: Path | None = None) -> Path:
    """Ship the centroids of key-space adapter ``source`` (a shipped name or an adapter folder) again as ``name``,
    served with another ``budget``, ``key_scores``, ``union_block``, ``min_keys`` and/or ``dense_heads`` (a
    ``--dense-heads`` list of layer:kv_head pairs; inference settings: the centroids do not depend on them),
    with a card that points at ``source``'s for the fit and gives this one's measured tables. Why a copy and not a
    flag: a user loads one name and gets the measured configuration (decode = prefill, no setting to remember)."""
    from ..adapters import resolve
    from ..hf.heads import parse_dense_heads

    if budget is None and key_scores is None and union_block is None and min_keys is None and dense_heads is None:
        raise InputError("run", source, "a key-space adapter is shipped again only with --budget, --key-scores, "
                         "--union-block, --min-keys and/or --dense-heads")
    heads = None if dense_heads is None else parse_dense_heads(dense_heads)
    if isinstance(heads, dict):
        raise InputError("dense_heads", dense_heads, "allowed a layer:kv_head list (e.g. 17:1,18:2) for a key-space "
                         "adapter: its heads are chosen once, then shipped by name")
    if not name or "/" in name or name.startswith("."):
        raise InputError("name", name, "a plain folder name, e.g. smollm2-135m-focus-keys256-means")
    try:
        src = resolve(source)
    except ValueError as e:
        raise InputError("run", source, str(e)) from None
    verify_adapter(src)
    acfg = json.loads((src / CONFIG).read_text())
    if acfg["focus_config"].get("router_input") != "keys":
        raise InputError("run", source, "a key-space adapter (router_input='keys') with --budget/--key-scores/"
                         "--union-block/--min-keys")
    own = tuple(map(tuple, acfg["focus_config"].get("dense_heads") or ()))
    changes = _serve_changes(budget, key_scores, union_block, min_keys, heads)
    acfg["focus_config"] = FocusConfig.from_dict({**acfg["focus_config"], **changes}).to_dict()  # validated first
    le = _long_evals(long_eval)
    mb = _need(Path(model_bench), "focusattn bench-model") if model_bench else None
    out = (dest or HERE) / name
    if out.resolve() == src.resolve():
        raise InputError("name", name, f"a new name: {source!r} is the source (use --refresh-card to re-render it)")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy2(src / WEIGHTS, tmp / WEIGHTS)
    write_json(tmp / CONFIG, acfg)
    fc = acfg["focus_config"]
    what = {"means": "the running mean of the group's own keys before the query's window (the fitted centroid "
                     "counted as one more key)", "centroids": "its fitted centroid"}[fc["key_scores"]]
    lines = [f"# {name}", "",
             f"The centroids of `{source}` (same tensors; how they were fitted: its model card), served with "
             f"`{', '.join(f'{k}={v!r}' for k, v in changes.items() if k != 'dense_heads')}`"
             f"{' and other dense heads' if 'dense_heads' in changes else ''}: each query scores a key group by {what} "
             f"(`FocusConfig.key_scores`, docs/DESIGN.md) and joins groups in that order until they hold "
             f"{fc['budget']:.0%} of its distant keys (beyond the {fc['window']}-token window, after "
             f"{fc['sink_tokens']} sink)"
             + (f", at least {fc['min_keys']} of them (`FocusConfig.min_keys`)" if fc.get("min_keys") else "")
             + (f", and also keeps every group the earlier queries of its {fc['union_block']}-token block and the "
                "block before joined (`FocusConfig.union_block`)" if fc.get("union_block") else "")
             + ". Served exactly by the sparse kernels (decode = prefill)"
             + (_heads_sentence(own, changes["dense_heads"]) if "dense_heads" in changes else
                f", with the source's {len(fc['dense_heads'])} dense key/value heads" if fc.get("dense_heads") else "")
             + ".", "",
             *_usage_and_command(acfg["base_model"], f'fa.load_adapter(model, "{name}")',
                                 f"focusattn ship-adapter {source} --name {name} {_serve_flags(changes)}",
                                 long_eval, model_bench)]
    return _finish(tmp, out, lines, le, mb)


def _heads_sentence(own: tuple, served: tuple) -> str:
    """How a derived key-space adapter's dense heads differ from its source's, for its card."""
    listed = lambda hs: ", ".join(f"{a}:{b}" for a, b in sorted(hs)) or "none"  # noqa: E731
    added, dropped = set(served) - set(own), set(own) - set(served)
    return (f", with {len(served)} dense key/value heads, layer:head `{listed(served)}` (the source's {len(own)}"
            + (f", and `{listed(added)}`" if added else "") + (f", without `{listed(dropped)}`" if dropped else "")
            + "; docs/DECISIONS.md says how they were chosen)")


def _scored(model: str, adapter: Path, counts: dict) -> tuple:
    """:func:`..hf.heads.scored_heads` of ``model`` with the routers of ``adapter`` attached."""
    import torch

    from ..hf import load_adapter, load_model
    from ..hf.heads import scored_heads

    m, _ = load_model(model)
    load_adapter(m, adapter)
    with torch.no_grad():
        return scored_heads(m.eval(), counts)


def derive_adapter(source: str, name: str, *, dense_heads: str, model: str = "smollm2-135m", long_eval=None,
                   model_bench=None, dest: Path | None = None) -> Path:
    """Ship the routers of adapter ``source`` (a shipped name or an adapter folder) served with ``dense_heads`` (a
    ``--dense-heads`` spec; scored heads, ``induction:N`` / ``duplicate:M``, are measured on ``model``): the same tensors, a config with the dense
    heads, and a card that points at ``source``'s for the training and gives this one's measured tables."""
    import torch

    from ..adapters import resolve
    from ..hf import load_adapter, load_model, save_adapter, update_config
    from ..hf.heads import describe, parse_dense_heads, scored_heads

    spec = parse_dense_heads(dense_heads)
    if not name or "/" in name or name.startswith("."):
        raise InputError("name", name, "a plain folder name, e.g. smollm2-135m-focus-k8-heads6")
    src = resolve(source)
    le = _long_evals(long_eval)
    mb = _need(Path(model_bench), "focusattn bench-model") if model_bench else None
    m, _ = load_model(model)
    load_adapter(m, src)
    with torch.no_grad():
        heads = scored_heads(m.eval(), spec) if isinstance(spec, dict) else spec
    cfg = update_config(m, dense_heads=heads)
    out = (dest or HERE) / name
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_adapter(m, tmp)
    listed = ", ".join(f"{a}:{b}" for a, b in cfg.dense_heads)
    chosen = (f"{describe(spec)} (`--dense-heads {dense_heads}`)" if isinstance(spec, dict)
              else f"the key/value heads `{listed}`")
    lines = [f"# {name}", "",
             f"The routers of `{source}` (same tensors; how they were trained: its model card), served with "
             f"{len(cfg.dense_heads)} dense heads: {chosen}, layer:head `{listed}`. Those heads keep full causal "
             "attention, the rest of each layer the routed mask (`FocusConfig.dense_heads`, docs/DESIGN.md "
             "\"Dense heads\").", "",
             *_usage_and_command(model, f'fa.load_adapter(model, "{name}"); fa.set_top_k(model, 1)   # hard top-1: '
                                 "the exact sparse kernels",
                                 f"focusattn ship-adapter {source} --name {name} --dense-heads {dense_heads}",
                                 long_eval, model_bench)]
    return _finish(tmp, out, lines, le, mb)
