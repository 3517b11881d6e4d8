"""Focus: learned token groups decide which distant pairs attend."""
from .attend import attend
from .cache import RoutingCache
from .config import FocusConfig
from .router import FocusRouter, Routing
from .sinkhorn import sinkhorn, sinkhorn_potentials

__all__ = ["FocusConfig", "FocusRouter", "Routing", "RoutingCache", "attend", "sinkhorn", "sinkhorn_potentials"]
