"""Predict what multi-streaming buys: a cost model (XLA's measured collective times where
it has them, calibrated from measurements when given a calibration file, the program's
own measured costs when given a PGLE profile), a schedule simulator with error ranges,
and pictures of the predicted timeline (Perfetto trace, self-contained HTML report:
``visual``)."""

from xla_streams.simulate.calibration import Calibration, CalibrationError, load_calibration
from xla_streams.simulate.cost import CollectiveCost, CostModel, OpCost, collective_cost
from xla_streams.simulate.errors import MODEL_ERRORS, ErrorBound, ErrorScale
from xla_streams.simulate.execution_streams import execution_streams, xla_stream_assignment
from xla_streams.simulate.measured import (
    CollectiveTable,
    PerfTable,
    PerfTableError,
    default_perf_table,
    load_perf_table,
)
from xla_streams.simulate.profile import MeasuredCosts, Profile, ProfileError, load_profile
from xla_streams.simulate.ranges import PredictionRange, predict_range
from xla_streams.simulate.simulator import Simulator
from xla_streams.simulate.targets import (
    TARGETS,
    Target,
    get_target,
    load_target,
    with_perf_table,
)
from xla_streams.simulate.timeline import SimResult
from xla_streams.simulate.whatif import WhatIf, what_if

__all__ = [
    "MODEL_ERRORS",
    "TARGETS",
    "Calibration",
    "CalibrationError",
    "CollectiveCost",
    "CollectiveTable",
    "CostModel",
    "ErrorBound",
    "ErrorScale",
    "MeasuredCosts",
    "OpCost",
    "PerfTable",
    "PerfTableError",
    "PredictionRange",
    "Profile",
    "ProfileError",
    "SimResult",
    "Simulator",
    "Target",
    "WhatIf",
    "collective_cost",
    "default_perf_table",
    "execution_streams",
    "get_target",
    "load_calibration",
    "load_perf_table",
    "load_profile",
    "load_target",
    "predict_range",
    "what_if",
    "with_perf_table",
    "xla_stream_assignment",
]
