"""Predict what multi-streaming buys: a cost model (calibrated from measurements when
given a calibration file), a schedule simulator, and pictures of the predicted
timeline (Perfetto trace, self-contained HTML report: ``visual``)."""

from xla_streams.simulate.calibration import Calibration, CalibrationError, load_calibration
from xla_streams.simulate.cost import CollectiveCost, CostModel, OpCost, collective_cost
from xla_streams.simulate.simulator import SimResult, Simulator, WhatIf, what_if
from xla_streams.simulate.targets import TARGETS, Target, get_target, load_target

__all__ = [
    "TARGETS",
    "Calibration",
    "CalibrationError",
    "CollectiveCost",
    "CostModel",
    "OpCost",
    "SimResult",
    "Simulator",
    "Target",
    "WhatIf",
    "collective_cost",
    "get_target",
    "load_calibration",
    "load_target",
    "what_if",
]
