"""``LazyConfig``: every Lazy Attention knob in one validated, typed place (decisions documented per field)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..kernels.elastic import BIAS_BEYOND, IMPLS  # names defined by the kernel that implements them

TAU_MODES = ("nonneg", "free")  # implemented by attention.LazyAttention
BIAS_INITS = ("zeros", "normal")  # implemented by bias.DistanceBias


def config_from_dict(cls, d: dict):
    """``cls(**d)`` for a config dataclass, refusing unknown keys by name (a typo in a saved config must not pass)."""
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}; known: {sorted(known)}")
    return cls(**d)


@dataclass(frozen=True)
class LazyConfig:
    """Lazy Attention (RoPE + per-head distance bias + Elastic-Softmax).

    n_heads, n_kv_heads: query heads and key/value heads (GQA when fewer; ``None`` = ``n_heads``).
    max_seq_len: RoPE cache length; longer inputs raise instead of silently wrapping.
    rope_base: 100000 by default. The paper asks for a "larger base" without a value; the dev code's multi-base
        experiments centre on 150000 and Llama-style long-context models use 1e5..5e5. A larger base slows the lowest
        frequencies so that long distances stay distinguishable, leaving short-range shape to the bias table. At the
        lab's short context it does not help (lazy-no-bias vs elastic-only in docs/RESULTS.md, lab section): a base
        sized for 4K-token training, not for short contexts.
    use_bias: learnable per-head distance table ``b[h, d]`` for ``d < bias_window``.
    bias_window (W): table width; past it the bias is 0 (``bias_beyond="zero"``, dev-code default) or the last entry
        (``"clamp"``). Zero beyond W keeps lengths past W (and past the training length) on plain RoPE.
    bias_init: ``"zeros"`` (default: at step 0 the layer is exactly RoPE + Elastic-Softmax, so the table only moves
        where the loss asks it to) or ``"normal"`` (N(0, bias_init_std), the swat-attention dev code's 1e-3).
    tau_mode: ``"nonneg"`` (default) stores an unconstrained ``theta`` with ``tau = softplus(theta)``; ``"free"`` is
        the paper's unconstrained tau. A negative tau adds ``|tau|/n`` to every visible key, rows then sum to
        ``1 + |tau|`` and nothing is zero (reviewer R4's point: learned offsets turned negative and *added* mass),
        which defeats the purpose of thresholding; softplus keeps the threshold >= 0 and smooth.
    threshold_len: None (default, the paper) or a length L: the threshold is ``tau / min(n_i, L)``, so inputs longer
        than L keep thresholds at the scale of an L-token context (the lab's extrapolation ablation sets it to the
        training length at evaluation time).
    tau_init: initial tau (1.0: threshold = the uniform weight 1/n, the paper's best Table 2 setting).
    impl, block: kernel choice (``"chunked"`` never builds a T x T tensor; ``"reference"`` is the dense oracle, equal
        within float rounding) and the chunked path's key-block size (``focusattn bench-lazy --block`` measures others).
    """

    n_heads: int
    n_kv_heads: int | None = None
    max_seq_len: int = 2048
    rope_base: float = 100000.0
    use_bias: bool = True
    bias_window: int = 512
    bias_init: str = "zeros"
    bias_init_std: float = 1e-3
    bias_beyond: str = "zero"
    tau_mode: str = "nonneg"
    tau_init: float = 1.0
    threshold_len: int | None = None
    impl: str = "chunked"
    block: int = 64

    def __post_init__(self):
        def bad(name, allowed):
            raise ValueError(f"LazyConfig.{name}={getattr(self, name)!r} is invalid: allowed {allowed}")

        if not isinstance(self.n_heads, int) or self.n_heads < 1:
            bad("n_heads", "an integer >= 1")
        if self.n_kv_heads is not None and (not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1
                                            or self.n_heads % self.n_kv_heads):
            bad("n_kv_heads", f"None or a positive divisor of n_heads ({self.n_heads})")
        if not isinstance(self.max_seq_len, int) or self.max_seq_len < 1:
            bad("max_seq_len", "an integer >= 1")
        if not self.rope_base > 1:
            bad("rope_base", "a float > 1")
        if not isinstance(self.bias_window, int) or self.bias_window < 1:
            bad("bias_window", "an integer >= 1 (W, the bias table width)")
        if self.bias_init not in BIAS_INITS:
            bad("bias_init", BIAS_INITS)
        if not self.bias_init_std >= 0:
            bad("bias_init_std", "a float >= 0")
        if self.bias_beyond not in BIAS_BEYOND:
            bad("bias_beyond", BIAS_BEYOND)
        if self.tau_mode not in TAU_MODES:
            bad("tau_mode", TAU_MODES)
        if self.tau_mode == "nonneg" and not self.tau_init > 0:
            bad("tau_init", "a float > 0 when tau_mode='nonneg' (softplus cannot reach 0)")
        if self.threshold_len is not None and (not isinstance(self.threshold_len, int) or self.threshold_len < 1):
            bad("threshold_len", "None or an integer >= 1")
        if self.impl not in IMPLS:
            bad("impl", IMPLS)
        if not isinstance(self.block, int) or self.block < 1:
            bad("block", "an integer >= 1")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LazyConfig":
        return config_from_dict(cls, d)


@dataclass(frozen=True)
class ElasticConfig:
    """Elastic-Softmax on a *pretrained* model (``hf/lazy.py``, ``focusattn retrofit --method lazy``): the model keeps
    its own positions (RoPE or learned), its projections and its mask; each attention layer gains one threshold per
    query head (and optionally a distance-bias table) and computes ``ReLU(softmax(s + b) - tau_h / n_i)`` with no
    renormalisation.

    tau_init: the starting threshold of every head (1.0 = the uniform weight 1/n, the paper's Table 2 setting; 0 with
        ``tau_mode="free"`` is the original model exactly). tau_mode: as :class:`LazyConfig`.
    train_tau: False freezes tau at ``tau_init`` (a training-free point of the sink/perplexity trade-off curve).
    use_bias, bias_window, bias_beyond: the Lazy distance-bias table on top of the model's own positions, zero at the
        start (so the start is exactly "softmax + threshold"); off by default: a pretrained RoPE model already encodes
        distance, and the table adds H x W parameters per layer.
    threshold_len, impl, block: as :class:`LazyConfig`.
    """

    tau_init: float = 1.0
    tau_mode: str = "nonneg"
    train_tau: bool = True
    use_bias: bool = False
    bias_window: int = 512
    bias_beyond: str = "zero"
    threshold_len: int | None = None
    impl: str = "chunked"
    block: int = 64

    def __post_init__(self):
        def bad(name, allowed):
            raise ValueError(f"ElasticConfig.{name}={getattr(self, name)!r} is invalid: allowed {allowed}")

        if isinstance(self.tau_init, bool) or not isinstance(self.tau_init, (int, float)) or self.tau_init != self.tau_init:
            bad("tau_init", "a float")
        if self.tau_mode not in TAU_MODES:
            bad("tau_mode", TAU_MODES)
        if self.tau_mode == "nonneg" and not self.tau_init > 0:
            bad("tau_init", "a float > 0 when tau_mode='nonneg' (softplus cannot reach 0; use tau_mode='free' for 0)")
        for name in ("train_tau", "use_bias"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "True or False")
        if isinstance(self.bias_window, bool) or not isinstance(self.bias_window, int) or self.bias_window < 1:
            bad("bias_window", "an integer >= 1 (W, the bias table width)")
        if self.bias_beyond not in BIAS_BEYOND:
            bad("bias_beyond", BIAS_BEYOND)
        if self.threshold_len is not None and (isinstance(self.threshold_len, bool)
                                               or not isinstance(self.threshold_len, int) or self.threshold_len < 1):
            bad("threshold_len", "None or an integer >= 1")
        if self.impl not in IMPLS:
            bad("impl", IMPLS)
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            bad("block", "an integer >= 1")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ElasticConfig":
        return config_from_dict(cls, d)
