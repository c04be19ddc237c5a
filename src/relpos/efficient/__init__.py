"""Sub-quadratic attention with relative positions: recurrent (GateLoop, LightNet) forms."""

from .gateloop import gateloop_scan
from .lightnet import LightNetState, lightnet_keys, lightnet_scan, lrpe_theta, md_lrpe, tpe_scan
from .recurrence import decayed_recurrence

__all__ = [
    "gateloop_scan",
    "decayed_recurrence",
    "lightnet_scan",
    "lightnet_keys",
    "LightNetState",
    "md_lrpe",
    "lrpe_theta",
    "tpe_scan",
]
