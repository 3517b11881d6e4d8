"""``focusattn eval``: lm-evaluation-harness on the in-memory model, the original and the Focus-composed one side by side.

One model is loaded once. The adapter (if any) is loaded first, so a foreign or corrupt adapter fails before any
evaluation; then Focus is removed (``unload``), the original is evaluated, the adapter is loaded again and every
requested mode (soft gate, hard top-k) is evaluated with :func:`focusattn.set_top_k`. lm-eval's response cache is
off: every mode really runs. Results (per task, per mode: each metric with its standard error and the delta vs the
original) go to ``OUT/eval.json`` and ``OUT/eval.md``, written atomically after every mode: a killed run keeps the
modes it finished, marked ``"complete": false``.
"""
from __future__ import annotations

import difflib
import logging
import math
import platform
import time
from contextlib import nullcontext
from pathlib import Path

from .._io import write_json, write_text
from .tasks import OFFLINE_DIR, OFFLINE_GROUP, OFFLINE_TASKS

log = logging.getLogger(__name__)
ORIGINAL = "original"


def _require_lm_eval():
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        raise RuntimeError("focusattn eval needs lm-evaluation-harness: pip install 'focusattn[eval]' "
                           "(lm-eval==0.4.13)") from e
    from importlib.metadata import version

    return version("lm_eval")


# ----------------------------------------------------------------------------------------------------------- inputs
def resolve_adapter(spec: str | None) -> Path | None:
    """Adapter spec (a shipped adapter's name, an adapter folder or a retrofit run folder) -> adapter folder."""
    if not spec:
        return None
    from ..adapters import resolve

    return resolve(spec)


def parse_modes(spec: str) -> list[int | None]:
    """``"soft,1,2"`` -> ``[None, 1, 2]`` (None = soft gate, k = hard top-k)."""
    modes: list[int | None] = []
    for x in (s.strip() for s in spec.split(",")):
        if not x:
            continue
        if x == "soft":
            modes.append(None)
        elif x.isdigit() and int(x) >= 1:
            modes.append(int(x))
        else:
            raise ValueError(f"--top-k {spec!r}: expected a comma list of 'soft' and integers >= 1")
    return list(dict.fromkeys(modes))


def mode_name(k: int | None) -> str:
    return "soft" if k is None else f"top{k}"


def parse_limit(limit: str | float | int | None):
    if limit in (None, ""):
        return None
    v = float(limit)
    if v <= 0:
        raise ValueError(f"--limit {limit}: must be > 0 (an integer count, or a fraction < 1)")
    return int(v) if v >= 1 else v


def task_manager(names: list[str]):
    """A TaskManager that knows our offline tasks; lm-eval's own ~14k configs are indexed only when a name needs
    them (that index takes several seconds)."""
    from lm_eval.tasks import TaskManager

    ours = {OFFLINE_GROUP, *OFFLINE_TASKS}
    return TaskManager(include_path=str(OFFLINE_DIR), include_defaults=not set(names) <= ours)


def resolve_tasks(spec: str):
    """Comma list -> (names, TaskManager). Unknown names: one-line error with the available ones."""
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if not names:
        raise ValueError("--tasks is empty")
    tm = task_manager(names)
    known = set(tm.all_tasks)
    unknown = [n for n in names if n not in known and not tm.match_tasks([n])]
    if unknown:
        ours = [OFFLINE_GROUP, *OFFLINE_TASKS]
        close = sorted({c for n in unknown for c in difflib.get_close_matches(n, tm.all_tasks, n=5, cutoff=0.6)})
        hub = len(known - set(ours))
        raise ValueError(f"unknown task(s) {', '.join(map(repr, unknown))}; available offline: {', '.join(ours)}"
                         + (f"; plus {hub} lm-eval tasks (e.g. hellaswag, arc_easy, lambada_openai; "
                            "`lm_eval ls tasks` lists them)" if hub else "")
                         + (f"; did you mean: {', '.join(close)}" if close else ""))
    return names, tm


# ---------------------------------------------------------------------------------------------------------- running
def _metrics(task_res: dict) -> dict[str, dict]:
    """lm-eval's flat ``{"acc,none": x, "acc_stderr,none": s}`` -> ``{"acc": {"value": x, "stderr": s}}``."""
    out = {}
    for key, v in task_res.items():
        if "," not in key or "_stderr," in key:
            continue
        metric, filt = key.split(",", 1)
        if not isinstance(v, (int, float)):
            continue
        name = metric if filt == "none" else f"{metric},{filt}"
        se = task_res.get(f"{metric}_stderr,{filt}")
        out[name] = {"value": float(v), "stderr": float(se) if isinstance(se, (int, float)) and math.isfinite(se)
                     else None}
    return out


def _breakdowns(samples: dict) -> dict:
    """Per-depth accuracy of the passkey task (from the logged samples)."""
    out = {}
    for task, rows in (samples or {}).items():
        if task != "focus_passkey":
            continue
        by = {}
        for r in rows:
            d = r.get("doc", {}).get("depth")
            if d is not None and "acc" in r:
                by.setdefault(str(d), []).append(float(r["acc"]))
        out[task] = {"by_depth": {d: {"acc": sum(v) / len(v), "n": len(v)} for d, v in sorted(by.items())}}
    return out


def _evaluate(lm, names, tm, *, limit, num_fewshot, bootstrap_iters, seed) -> tuple[dict, dict, dict]:
    from lm_eval import simple_evaluate

    res = simple_evaluate(model=lm, tasks=names, task_manager=tm, limit=limit, num_fewshot=num_fewshot,
                          bootstrap_iters=bootstrap_iters, use_cache=None, cache_requests=False, log_samples=True,
                          random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                          fewshot_random_seed=seed)
    if res is None:
        raise RuntimeError("lm_eval returned no results")
    metrics = {t: m for t, r in res["results"].items() if (m := _metrics(r))}
    n = {t: int(v.get("effective", v.get("original", 0))) if isinstance(v, dict) else int(v)
         for t, v in res.get("n-samples", {}).items()}
    return metrics, n, _breakdowns(res.get("samples"))


def run_eval(model_spec: str, tasks: str, out: str | Path, *, adapter: str | None = None, top_k: str = "soft,1,2",
             limit=None, batch_size: int = 1, num_fewshot: int | None = None, bootstrap_iters: int = 1000,
             seed: int = 0, command: str | None = None) -> dict:
    """Evaluate the original model and, with an adapter, each Focus mode; write ``eval.json`` and ``eval.md``."""
    lm_eval_version = _require_lm_eval()
    names, tm = resolve_tasks(tasks)
    modes = parse_modes(top_k)
    limit = parse_limit(limit)
    adapter_dir = resolve_adapter(adapter)
    if batch_size < 1:
        raise ValueError(f"--batch-size {batch_size}: must be >= 1")

    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM

    from .. import __version__
    from ..hf import is_composed, load_adapter, load_model, set_top_k, unload
    from ..hf.compose import focus_config

    from ..hf.lazy import elastic_config, is_lazy_adapter, load_lazy_adapter
    from ..hf.lora import is_lora_adapter, load_lora

    model, tok = load_model(model_spec)
    cfg, peft_model = None, None
    if adapter_dir is not None and is_lazy_adapter(adapter_dir):  # Elastic-Softmax (`retrofit --method lazy`)
        load_lazy_adapter(model, adapter_dir)  # refuses a foreign/corrupt adapter before anything is evaluated
        cfg = {"lazy": elastic_config(model).to_dict()}
        unload(model)
        modes = ["lazy"]
    elif adapter_dir is not None and is_lora_adapter(adapter_dir):  # a LoRA baseline (`retrofit --method lora`)
        peft_model = load_lora(model, adapter_dir)  # refuses a foreign adapter before anything is evaluated
        model = peft_model.get_base_model()  # LoRA layers sit in it; disable_adapter() gives the original
        cfg = {"lora": {k: peft_model.peft_config["default"].to_dict()[k] for k in ("r", "lora_alpha")}}
        modes = ["lora"]
    elif adapter_dir is not None:
        load_adapter(model, adapter_dir)  # refuses a foreign/corrupt adapter before anything is evaluated
        cfg = focus_config(model)
        bad = [k for k in modes if k is not None and k > cfg.num_groups]
        if bad:
            raise ValueError(f"--top-k {bad}: the adapter has only K={cfg.num_groups} groups")
        cfg = cfg.to_dict()
        unload(model)
    else:
        log.warning("no --adapter: only the original model is evaluated")
        modes = []
    model.eval()
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size)

    results, n_samples, breakdowns, seconds = {}, {}, {}, {}
    out = Path(out)
    all_modes = [ORIGINAL] + [k if k in ("lora", "lazy") else mode_name(k) for k in modes]
    done: list[str] = []

    def _result(done_modes: list[str], complete: bool) -> dict:
        deltas = {task: {mode: {m: v["value"] - by[ORIGINAL][m]["value"] for m, v in ms.items()
                                if m in by[ORIGINAL]}
                         for mode, ms in by.items() if mode != ORIGINAL}
                  for task, by in results.items() if ORIGINAL in by}
        return {
            "command": command,
            "complete": complete,
            "model": model_spec,
            "adapter": adapter, "adapter_path": str(adapter_dir) if adapter_dir else None,
            "focus_config": cfg,
            "tasks": names,
            "limit": limit,
            "num_fewshot": num_fewshot,
            "modes": list(done_modes),
            "modes_requested": all_modes,
            "results": results,
            "deltas": deltas,
            "n_samples": n_samples,
            "breakdowns": breakdowns,
            "seconds": seconds,
            "versions": {"lm_eval": lm_eval_version, "focusattn": __version__, "torch": torch.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version()},
        }

    for mode in [ORIGINAL] + modes:
        name = mode if mode in (ORIGINAL, "lora", "lazy") else mode_name(mode)
        if peft_model is not None:
            pass  # the LoRA layers are switched off for the original below
        elif mode == "lazy":
            load_lazy_adapter(model, adapter_dir)
            model.eval()
        elif mode != ORIGINAL:
            if not is_composed(model):
                load_adapter(model, adapter_dir)
            set_top_k(model, mode)
            model.eval()
        log.info("evaluating %s on %s", name, ", ".join(names))
        t0 = time.time()
        off = peft_model.disable_adapter() if peft_model is not None and mode == ORIGINAL else nullcontext()
        with torch.no_grad(), off:
            metrics, n, extra = _evaluate(lm, names, tm, limit=limit, num_fewshot=num_fewshot,
                                          bootstrap_iters=bootstrap_iters, seed=seed)
        seconds[name] = time.time() - t0
        for task, m in metrics.items():
            results.setdefault(task, {})[name] = m
        n_samples.update(n)
        for task, b in extra.items():
            breakdowns.setdefault(task, {})[name] = b
        done.append(name)
        if len(done) < len(all_modes):  # a killed run keeps the modes it finished (marked incomplete)
            _write(out, _result(done, complete=False))
    res = _result(done, complete=True)
    _write(out, res)
    return res


def _write(out: Path, res: dict) -> None:
    write_json(out / "eval.json", res)
    write_text(out / "eval.md", render_markdown(res))


# ------------------------------------------------------------------------------------------------------- rendering
def _cell(m: dict | None, delta: float | None = None) -> str:
    if m is None:
        return "—"
    s = f"{m['value']:.4g}"
    if m.get("stderr") is not None:
        s += f" ± {m['stderr']:.2g}"
    if delta is not None:
        s += f" ({delta:+.3g})"
    return s


def render_markdown(res: dict) -> str:
    modes = res["modes"]
    lines = [f"Command: `{res.get('command')}`", "",
             f"model `{res['model']}`, adapter `{res.get('adapter')}`; lm-eval {res['versions']['lm_eval']}; "
             f"limit {res.get('limit')}; value ± standard error (delta vs original)", ""]
    if not res.get("complete", True):
        lines += [f"**Incomplete run**: modes {', '.join(res['modes'])} of {', '.join(res['modes_requested'])} "
                  "finished.", ""]
    lines += ["| task | metric | n | " + " | ".join(m.replace("top", "top-") for m in modes) + " |",
              "|---|---|---|" + "---|" * len(modes)]
    for task, by in res["results"].items():
        metrics = list(dict.fromkeys(m for ms in by.values() for m in ms))
        for metric in metrics:
            cells = [_cell(by.get(ORIGINAL, {}).get(metric))]
            cells += [_cell(by.get(mode, {}).get(metric), res["deltas"].get(task, {}).get(mode, {}).get(metric))
                      for mode in modes[1:]]
            lines.append(f"| {task} | {metric} | {res['n_samples'].get(task, '')} | " + " | ".join(cells) + " |")
    pk = res.get("breakdowns", {}).get("focus_passkey")
    if pk:
        depths = sorted({d for b in pk.values() for d in b["by_depth"]}, key=float)
        lines += ["", "Passkey accuracy by depth of the key (0 = start of the filler; the question comes last):", "",
                  "| mode | " + " | ".join(depths) + " |", "|---|" + "---|" * len(depths)]
        for mode, b in pk.items():
            lines.append(f"| {mode} | " + " | ".join(f"{b['by_depth'][d]['acc']:.2f} (n={b['by_depth'][d]['n']})"
                                                      if d in b["by_depth"] else "—" for d in depths) + " |")
    lines += ["", "seconds per mode: " + ", ".join(f"{k} {v:.0f}" for k, v in res["seconds"].items())]
    return "\n".join(lines) + "\n"
