"""The two networks the replay runs on agree where both apply: without sharing, the
closed form (UnsharedNetwork: a collective's start and end known when it is issued)
gives the event loop's answers (Network with share=False), as a replay drives them."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from xla_streams.simulate.cost import CollectiveCost
from xla_streams.simulate.network import CollectiveSpec, Job, Network, UnsharedNetwork

LANES = 3


@st.composite
def issued_jobs(draw: st.DrawFn) -> list[tuple[float, int, CollectiveSpec]]:
    """(issue time, lane, collective) in the order a replay issues them: times never
    go back; costs with and without a transfer, sharing links or not."""
    jobs, t = [], 0.0
    for i in range(draw(st.integers(0, 12))):
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
        cost = CollectiveCost(
            "ring",
            "simple",
            latency=draw(st.sampled_from([0.0, 0.25, 1.0])),
            wire_bytes=draw(st.sampled_from([0.0, 1.0, 4.0])),
            bandwidth=draw(st.sampled_from([1.0, 2.0])),
            network=False,
            devices=tuple(draw(st.sets(st.integers(0, 3), min_size=1))),
        )
        spec = CollectiveSpec(f"c{i}", "all-reduce", 1, cost)
        jobs.append((t, draw(st.integers(0, LANES - 1)), spec))
    return jobs


@settings(max_examples=300, deadline=None)
@given(issued_jobs(), st.randoms(use_true_random=False))
def test_the_closed_form_finishes_each_collective_when_the_event_loop_does(
    jobs: list[tuple[float, int, CollectiveSpec]], rng: object
) -> None:
    events, closed = Network(share=False, recorder=None), UnsharedNetwork(recorder=None)
    issued: list[tuple[Job, Job]] = []
    for index, (t, lane, spec) in enumerate(jobs):
        events.run(until_time=t)
        closed.run(until_time=t)
        assert events.idle() == closed.idle(), t
        for other in range(LANES):
            assert events.lane_busy(other) == closed.lane_busy(other), (t, other)
        a, b = Job(index, spec, lane, t), Job(index, spec, lane, t)
        events.submit(a)
        closed.submit(b)
        issued.append((a, b))
    # Waited for in any order, as dones come in a schedule.
    order = list(issued)
    rng.shuffle(order)  # type: ignore[attr-defined]
    for a, b in order:
        events.run(until_job=a)
        closed.run(until_job=b)
        assert a.end is not None and b.end is not None
        assert math.isclose(a.begin, b.begin, abs_tol=1e-9), a.spec.name
        assert math.isclose(a.end, b.end, abs_tol=1e-9), a.spec.name
    events.run(until_time=math.inf)
    assert closed.idle()
    assert events.busy.keys() == closed.busy.keys()
    for lane, busy in events.busy.items():
        assert math.isclose(busy, closed.busy[lane], abs_tol=1e-9), lane
    assert [j.end for j in events.finished] == [j.end for j in closed.finished]
