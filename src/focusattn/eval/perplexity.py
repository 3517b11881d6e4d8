"""Perplexity over fixed evaluation windows (every token of every window is scored)."""
from __future__ import annotations

import math

import numpy as np
import torch
from tqdm.auto import tqdm


@torch.no_grad()
def perplexity(model, windows: np.ndarray, *, batch_size: int = 1, desc: str = "eval", progress: bool = True) -> dict:
    """Token-weighted perplexity of ``model`` on ``windows`` [N, T] (first token of each window is context only)."""
    was_training = model.training
    model.eval()
    nll, count = 0.0, 0
    device = next(model.parameters()).device
    bar = tqdm(range(0, len(windows), batch_size), desc=desc, leave=False, disable=not progress, unit="win")
    for i in bar:
        x = torch.as_tensor(np.asarray(windows[i:i + batch_size]), dtype=torch.long, device=device)
        logits = model(x).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                 reduction="sum")
        nll += loss.item()
        count += x[:, 1:].numel()
        bar.set_postfix(ppl=f"{math.exp(nll / count):.2f}")
    model.train(was_training)
    return {"ppl": math.exp(nll / count), "nll": nll / count, "tokens": count}
