"""Focus: learned token groups decide which distant pairs attend."""
from .attend import attend
from .config import FocusConfig
from .router import FocusRouter, Routing
from .sinkhorn import sinkhorn, sinkhorn_potentials

__all__ = ["FocusConfig", "FocusRouter", "Routing", "attend", "sinkhorn", "sinkhorn_potentials"]
