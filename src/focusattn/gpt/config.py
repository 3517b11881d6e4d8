"""Typed, validated configs for the from-scratch lab LM, and the named presets."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from .._errors import InputError
from ..lazy.config import IMPLS as LAZY_IMPLS
from ..lazy.config import TAU_MODES
from ..train.loop import TrainConfig as LoopConfig

ATTENTIONS = ("standard", "lazy", "lazy-no-bias", "elastic-only", "focus", "sliding")
# The Hugging Face model type of the lab GPT (hf/lab_model.py registers it): a run folder's config.json names it, so
# transformers' Auto classes recognise the folder.
HF_MODEL_TYPE = "focusattn-lab-gpt"
# RoPE base per variant when ModelConfig.rope_base is None. The Lazy variants use the "larger base" the paper asks for
# (see LazyConfig.rope_base); elastic-only keeps the standard base, so lazy-no-bias vs elastic-only isolates the base.
DEFAULT_ROPE_BASE = {"standard": 10000.0, "sliding": 10000.0, "focus": 10000.0, "elastic-only": 10000.0,
                     "lazy": 100000.0, "lazy-no-bias": 100000.0}


def _bad(cls, name, value, allowed):
    raise ValueError(f"{cls}.{name}={value!r} is invalid: allowed {allowed}")


def check_attention(name: str) -> str:
    if name not in ATTENTIONS:
        raise ValueError(f"unknown attention {name!r}; valid: {', '.join(ATTENTIONS)}")
    return name


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only LM shape and the attention variant.

    block_size: training context length. max_seq_len: RoPE cache length (and the longest evaluation), 4x block_size
        by default so the 2x/4x extrapolation evaluations fit.
    window: local window. ``sliding`` sees ``window`` keys (``0 <= i - j < window``, transformers'
        ``sliding_window`` convention); ``focus`` never gates pairs with ``0 <= i - j <= window`` (Focus's convention,
        ``kernels.common.in_window``), i.e. ``window + 1`` keys. (The lab's results were measured so.)
    lazy_impl: Elastic-Softmax kernel of the Lazy variants. The lab uses the dense oracle: at the lab's short
        contexts it costs about what the chunked path does, and the two agree to float rounding.
    bias_window: Lazy bias table width W; None = block_size (longer distances are never seen in training, so a wider
        table would only hold untrained entries; past W the bias is 0).
    """

    attention: str = "standard"
    vocab_size: int = 257
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    block_size: int = 128
    max_seq_len: int | None = None
    rope_base: float | None = None
    window: int = 32
    bias_window: int | None = None
    tau_mode: str = "nonneg"
    lazy_impl: str = "reference"
    focus_groups: int = 4
    focus_group_dim: int = 16
    mlp_ratio: int = 4

    def __post_init__(self):
        c = "ModelConfig"
        check_attention(self.attention)
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "block_size", "window", "focus_groups",
                     "focus_group_dim", "mlp_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                _bad(c, name, v, "an integer >= 1")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            _bad(c, "d_model", self.d_model, f"a multiple of n_head ({self.n_head}) with an even head size (RoPE)")
        if self.max_seq_len is not None and (not isinstance(self.max_seq_len, int) or self.max_seq_len < self.block_size):
            _bad(c, "max_seq_len", self.max_seq_len, f"None or an integer >= block_size ({self.block_size})")
        if self.rope_base is not None and not self.rope_base > 1:
            _bad(c, "rope_base", self.rope_base, "None (variant default) or a float > 1")
        if self.bias_window is not None and (not isinstance(self.bias_window, int) or self.bias_window < 1):
            _bad(c, "bias_window", self.bias_window, "None (= block_size) or an integer >= 1")
        if self.tau_mode not in TAU_MODES:
            _bad(c, "tau_mode", self.tau_mode, TAU_MODES)
        if self.lazy_impl not in LAZY_IMPLS:
            _bad(c, "lazy_impl", self.lazy_impl, LAZY_IMPLS)

    @property
    def seq_cache(self) -> int:
        return 4 * self.block_size if self.max_seq_len is None else self.max_seq_len

    @property
    def base(self) -> float:
        return DEFAULT_ROPE_BASE[self.attention] if self.rope_base is None else float(self.rope_base)

    def to_dict(self) -> dict:
        return asdict(self)


# The lab's results (config.json, result.json, compare.json, docs/results/lab*.json) name two shared training fields
# by their earlier lab names; to_dict keeps those names so finished runs are still recognised and resumable.
_LEGACY_NAMES = {"clip": "grad_clip", "checkpoint_every": "ckpt_interval"}
_LEGACY_ORDER = ("batch_size", "steps", "lr", "warmup", "min_lr_ratio", "weight_decay", "clip", "log_interval",
                 "eval_interval", "eval_windows", "checkpoint_every", "threads")


@dataclass(frozen=True)
class TrainConfig(LoopConfig):
    """The shared training fields (:class:`~focusattn.train.loop.TrainConfig`: AdamW + linear warmup + cosine decay)
    with the lab's defaults, and the lab's logging/evaluation cadence. Equal compute across variants = the same
    TrainConfig. ``seed`` and ``resume`` are set per run by ``train_lm``."""

    batch_size: int = 32
    steps: int = 600
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    checkpoint_every: int = 100
    log_interval: int = 10
    eval_interval: int = 100
    eval_windows: int = 32
    threads: int = 1

    def __post_init__(self):
        super().__post_init__()
        for name in ("log_interval", "eval_interval", "eval_windows", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(name, v, f"allowed an integer >= 1 (TrainConfig.{name})")

    def to_dict(self) -> dict:
        """What a run records: the lab's fields under their recorded names (per-run ``seed`` and ``resume`` are
        recorded elsewhere; ``grad_accum`` only when it is not 1)."""
        d = asdict(self)
        out = {_LEGACY_NAMES.get(k, k): d[k] for k in _LEGACY_ORDER}
        if self.grad_accum != 1:
            out["grad_accum"] = self.grad_accum
        return out


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    note: str = ""


PRESETS: dict[str, Preset] = {
    # Unit tests and smoke runs: seconds.
    "tiny": Preset(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=32, window=8, focus_groups=2,
                               focus_group_dim=8),
                   TrainConfig(batch_size=4, steps=8, warmup=2, log_interval=2, eval_interval=4, eval_windows=2,
                               checkpoint_every=4),
                   note="tests only"),
    # The lab on 2 shared CPU cores: about 3 minutes per run on one thread.
    "lab": Preset(ModelConfig(n_layer=4, n_head=4, d_model=128, block_size=128, window=32),
                  TrainConfig(batch_size=16, steps=500, lr=3e-3, warmup=50, eval_interval=100, eval_windows=24,
                              checkpoint_every=100),
                  note="4 layers x 128 wide, T=128, 500 steps of 16 x 128 bytes (~1M tokens)"),
    # The lab model trained 4x longer: the first place on 2 CPU cores where the standard model's layer-0 sink emerges.
    "lab-long": Preset(ModelConfig(n_layer=4, n_head=4, d_model=128, block_size=128, window=32),
                       TrainConfig(batch_size=16, steps=2000, lr=3e-3, warmup=50, eval_interval=250, eval_windows=24,
                                   checkpoint_every=250),
                       note="preset lab with 2000 steps (~4M tokens)"),
    # A longer context for the sink question: does the standard model park attention on the first token at T=512?
    "lab-sink": Preset(ModelConfig(n_layer=4, n_head=4, d_model=128, block_size=512, window=64),
                       TrainConfig(batch_size=8, steps=600, lr=3e-3, warmup=50, eval_interval=200, eval_windows=8,
                                   checkpoint_every=100),
                       note="lab model at T=512: 600 steps of 8 x 512 bytes (~2.5M tokens), ~15 min a run on 1 core"),
    # Long-range tasks (gpt/tasks.py), sized for a few minutes a run on a shared CPU.
    "mqar": Preset(ModelConfig(n_layer=2, n_head=2, d_model=64, block_size=32, window=8, focus_groups=2,
                               focus_group_dim=8),
                   TrainConfig(batch_size=64, steps=150, lr=3e-3, warmup=15, log_interval=25, eval_interval=50,
                               eval_windows=64, checkpoint_every=50),
                   note="for --data mqar (4 pairs, 16 keys, 16 values, T=32): every answer is >= 17 tokens after its "
                        "value; 2 stacked sliding windows of 8 keys reach 2 x 7 = 14 tokens, so sliding is at chance "
                        "(1/16) by construction"),
    "passkey": Preset(ModelConfig(n_layer=2, n_head=4, d_model=64, block_size=128, window=16, focus_groups=2,
                                  focus_group_dim=8),
                      TrainConfig(batch_size=32, steps=1500, lr=3e-3, warmup=30, log_interval=50, eval_interval=250,
                                  eval_windows=64, checkpoint_every=250),
                      note="for --data passkey (5 digits, min_gap 32, T=128): each answer digit is >= 90 tokens after "
                           "the needle digit it copies; 2 stacked sliding windows of 16 keys reach 2 x 15 = 30 tokens, "
                           "so sliding is at chance (1/10) by construction. The standard model needs the steps: at "
                           "chance until ~150, 37% at 500, 68% per digit at 1500 (3.5 min on 1 core, seed 0)"),
    # nanoGPT's shakespeare-char shape, for a machine with an accelerator.
    "small": Preset(ModelConfig(n_layer=6, n_head=6, d_model=384, block_size=256, window=64),
                    TrainConfig(batch_size=64, steps=5000, lr=1e-3, warmup=100, eval_interval=250, eval_windows=64,
                                checkpoint_every=250, threads=4),
                    note="nanoGPT shakespeare-char scale"),
}


def get_preset(name: str, attention: str, **model_overrides) -> tuple[ModelConfig, TrainConfig]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    p = PRESETS[name]
    return replace(p.model, attention=check_attention(attention), **model_overrides), p.train


def model_config_from_dict(d: dict) -> ModelConfig:
    known = {f.name for f in fields(ModelConfig)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown ModelConfig keys {sorted(unknown)}; known: {sorted(known)}")
    return ModelConfig(**d)
