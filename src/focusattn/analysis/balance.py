"""How balanced a composed model's learned routing is on the text of its last forward: what the sparse kernels pay.

The group part of hard top-k attention costs ``sum_g n_g (n_g + 1) / 2`` pairs (query and key roles:
``sum_g q_g n_g / 2``, ``q_g`` the group's queries); balanced groups (``k T / K`` tokens each) minimise it. One number per layer, and the worst layer, because the slowest layer sets the model's speed.
"""
from __future__ import annotations

import statistics

import torch


def routing_stats(model, t: int) -> dict:
    """Per layer: the largest group's share of tokens (top-1 assignment: as served at key top-1, ``capacity``
    included; the soft groups' top-1 otherwise), the group-part cost over the balanced
    value, and the cost-model ratio ``T(T+1)/2 / (group cost + T w)``; plus the worst layer of each. Reads
    ``hf.last_routing(model)``: call after a no-grad forward of ``t`` tokens with hard top-k set."""
    from ..hf import last_routing, routers

    layers = []
    for r, routing in zip(routers(model), last_routing(model)):
        m = routing.membership
        n = m[0, :t].sum(0).double()
        k_groups, top_k = m.shape[-1], int(m[0, 0].sum())
        qm = routing.query_membership  # query and key roles: group g costs its q_g queries against its n_g keys
        if qm is None:
            balanced = k_groups * (top_k * t / k_groups) * (top_k * t / k_groups + 1) / 2
            group_cost = float((n * (n + 1) / 2).sum())
        else:
            nq, kq = qm[0, :t].sum(0).double(), int(qm[0, 0].sum())
            balanced = k_groups * (kq * t / k_groups) * (top_k * t / k_groups) / 2
            group_cost = float((nq * n / 2).sum())
        # the served groups where a token holds one (the cap included), else the soft groups' top-1
        top1 = n if top_k == 1 else torch.bincount(routing.groups[0, :t].argmax(-1), minlength=k_groups).double()
        layers.append({"largest_share": float(top1.max() / t), "group_cost_vs_balanced": group_cost / balanced,
                       "cost_model_ratio": (t * (t + 1) / 2) / (group_cost + t * min(r.cfg.window, t))})
    return {"layers": layers,
            "max_largest_share": max(x["largest_share"] for x in layers),
            "max_group_cost_vs_balanced": max(x["group_cost_vs_balanced"] for x in layers),
            "mean_cost_model_ratio": statistics.mean(x["cost_model_ratio"] for x in layers)}
