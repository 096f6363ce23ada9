"""How sure a prediction is: the step time re-simulated with the model's stated errors.

``predict_range(simulator, assignment)`` replays the module three times: as
modelled (the expected value), with every input at the optimistic end of its
error bound (low), and with every input at the pessimistic end (high; what
collectives in flight take from the compute beside them among them: the clock
recovered on the SMs NCCL leaves, the HBM bytes it moves). The bounds, each with
its source, are :data:`~xla_streams.simulate.errors.MODEL_ERRORS` (``errors.py``;
``docs/predictions.md`` prints them as a table).

All inputs move together, so the range is an envelope (errors that partly cancel
in reality add up here), not a confidence interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.simulate.errors import MODEL_ERRORS, ErrorBound, ErrorScale
from xla_streams.simulate.simulator import Simulator
from xla_streams.streams import StreamAssignment, assign_streams


@dataclass(frozen=True)
class PredictionRange:
    """Step time and exposed communication (seconds) at the optimistic end, as modelled,
    and at the pessimistic end; the bounds that made the ends."""

    low: float
    expected: float
    high: float
    exposed_low: float
    exposed_expected: float
    exposed_high: float
    bounds: tuple[ErrorBound, ...] = MODEL_ERRORS

    def to_json(self) -> dict[str, object]:
        """The range in milliseconds, as a report's JSON holds it."""
        return {
            "step_ms": {
                "low": self.low * 1e3,
                "expected": self.expected * 1e3,
                "high": self.high * 1e3,
            },
            "exposed_communication_ms": {
                "low": self.exposed_low * 1e3,
                "expected": self.exposed_expected * 1e3,
                "high": self.exposed_high * 1e3,
            },
            "errors": {
                b.name: {"low": b.low, "high": b.high, "source": b.source} for b in self.bounds
            },
        }


def predict_range(
    simulator: Simulator,
    assignment: StreamAssignment | None = None,
    *,
    bounds: tuple[ErrorBound, ...] = MODEL_ERRORS,
) -> PredictionRange:
    """The step time of ``simulator``'s module under ``assignment`` (default: one
    collective stream, what XLA does) as modelled, and re-simulated with every input
    at each end of its error bound. The simulator's measured costs (a profile) carry
    their own, smaller, bound."""
    if assignment is None:
        assignment = assign_streams(simulator.pairs, 1, "interval")
    expected = simulator.run(assignment)
    low, high = (
        simulator.with_errors(ErrorScale.at(end, bounds)).run(assignment) for end in ("low", "high")
    )
    return PredictionRange(
        low=min(low.step_time, expected.step_time),
        expected=expected.step_time,
        high=max(high.step_time, expected.step_time),
        exposed_low=min(low.exposed_communication, expected.exposed_communication),
        exposed_expected=expected.exposed_communication,
        exposed_high=max(high.exposed_communication, expected.exposed_communication),
        bounds=bounds,
    )
