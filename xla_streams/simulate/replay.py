"""The replay of a compiled module for one assignment of lanes: the compute stream runs
each computation's steps in order, issuing collectives to the network and blocking at
their dones; a loop's iterations that repeat exactly are added up, not replayed."""

from __future__ import annotations

from xla_streams.simulate.compiler import (
    COMPUTE,
    DONE,
    FIRE,
    SIDE_DONE,
    SIDE_START,
    START,
    SYNC,
    CompiledModule,
    Step,
)
from xla_streams.simulate.interference import factors, slowdown
from xla_streams.simulate.network import CollectiveSpec, Job, Network, Recorder, UnsharedNetwork
from xla_streams.simulate.timeline import COMPUTE_LANE, OWN_STREAM_LANE, P2P_LANE, Slice

# A compute kernel: its seconds alone, of which bound by the matrix units, by HBM.
Kernel = tuple[float, float, float]
# The lane of a pair that takes the lowest-numbered stream of its own idle when it
# starts (the lower bound's).
DYNAMIC_LANE = -3


class Replay:
    """One replay of a compiled module on given lanes: the compute stream runs the steps
    in order, the network the collectives; the clock, and what it adds up."""

    def __init__(
        self,
        compiled: CompiledModule,
        lanes: list[int],
        share: bool,
        recorder: Recorder | None,
        interference: bool = True,
    ) -> None:
        """``lanes``: the lane of each pair (``DYNAMIC_LANE``: an idle stream of its own);
        the other collectives' steps say their lanes. ``interference``: collectives in
        flight slow the compute beside them (``interference.py``; also off when the
        target turns it off)."""
        self.specs = compiled.specs
        self.lanes = lanes
        self.interference = interference and compiled.target.interference
        # Nothing shared and nothing slowed: each collective takes its standalone time.
        self.network: Network | UnsharedNetwork = (
            Network(share, recorder) if share or self.interference else UnsharedNetwork(recorder)
        )
        self.recorder = recorder
        self.t = 0.0
        self.compute_busy = 0.0
        self.exposed = 0.0
        self.profiled = 0.0  # work measured (profile) and modelled, as run
        self.modeled = 0.0
        self.target = compiled.target
        self.errors = compiled.errors
        self.in_flight: dict[int, Job] = {}
        self.fired: list[Job] = []
        # (collective, seconds) of each wait of the compute stream on a collective: what
        # explaining a prediction reads (Simulator.replayed).
        self.waits: list[tuple[Job, float]] = []
        # (f_mat, f_mem) for the network's state after ``_changes`` events.
        self._factors = (1.0, 1.0)
        self._changes = -1
        # factors() by (SMs held, HBM bytes/s moved): the same collectives recur.
        self._factors_of: dict[tuple[int, float], tuple[float, float]] = {}

    def _count(self, spec: CollectiveSpec) -> None:
        if spec.profiled:
            self.profiled += spec.cost.seconds
        else:
            self.modeled += spec.cost.seconds

    def compute_time(self, seconds: float, kernels: tuple[Kernel, ...]) -> float:
        """What compute that takes ``seconds`` alone (``kernels``: its kernels' seconds,
        matrix and memory seconds) takes when it starts now: the overlapped part of each
        kernel slowed by the collectives running beside it (``interference.py``). The
        one place the replay prices compute against the collectives beside it.

        The network is advanced only when a kernel reaches its next event (a collective
        starting, ending its latency or finishing): between events the factors hold."""
        if not self.interference:
            return seconds
        network = self.network
        assert isinstance(network, Network)  # interference runs on the event network
        # Nothing in flight or queued: nothing can start before the compute ends (and
        # running the network up to now would not change that).
        if not network.collectives_pending():
            return seconds
        network.run(until_time=self.t)
        if not network.collectives_pending():
            return seconds
        t, event = self.t, network.next_event()
        alone = 0.0  # of the kernels done, their time alone
        for kernel_seconds, matrix, memory in kernels:
            remaining = kernel_seconds
            while True:
                if t >= event:
                    network.run(until_time=t)
                    if not network.collectives_pending():
                        # The rest runs alone: nothing can start before it ends.
                        return t + remaining + (seconds - alone - kernel_seconds) - self.t
                    event = network.next_event()
                if network.changes != self._changes:
                    self._changes = network.changes
                    state = (network.sms, network.hbm)
                    cached = self._factors_of.get(state)
                    if cached is None:
                        cached = self._factors_of[state] = factors(self.target, self.errors, *state)
                    self._factors = cached
                f = slowdown(kernel_seconds, matrix, memory, *self._factors)
                end = t + remaining * f
                if end <= event:
                    t = end
                    break
                remaining -= (event - t) / f
                t = event
            alone += kernel_seconds
        return t - self.t

    def program(self, steps: list[Step]) -> None:
        recorder = self.recorder
        network = self.network
        for step in steps:
            tag = step[0]
            if tag == COMPUTE:
                seconds = step[1]
                self.profiled += step[6]
                self.modeled += seconds - step[6]
                seconds = self.compute_time(seconds, step[7])
                if recorder is not None:
                    recorder.add(
                        Slice(
                            COMPUTE_LANE, step[2], step[3], self.t, seconds,
                            {"kind": step[3], "bytes": step[4], "flops": step[5],
                             "predicted_us": round(seconds * 1e6, 3)},
                        )
                    )  # fmt: skip
                self.t += seconds
                self.compute_busy += seconds
            elif tag == START:
                index = step[1]
                lane = self.lanes[index]
                if lane == DYNAMIC_LANE:
                    lane = self._idle_lane()
                job = Job(index, self.specs[index], lane, self.t)
                self._count(job.spec)
                network.submit(job)
                self.in_flight[index] = job
            elif tag == DONE:
                job = self.in_flight.pop(step[1])
                self._wait(job, "wait")
            elif tag == SYNC:
                index = step[1]
                job = Job(index, self.specs[index], COMPUTE_LANE, self.t)
                self._count(job.spec)
                network.submit(job)
                self._wait(job, None)
            elif tag == FIRE:
                index = step[1]
                job = Job(index, self.specs[index], P2P_LANE, self.t)
                self._count(job.spec)
                network.submit(job)
                self.fired.append(job)
            elif tag == SIDE_START:
                index = step[1]
                job = Job(index, self.specs[index], step[2], self.t)
                self._count(job.spec)
                network.submit(job)
                self.in_flight[index] = job
            elif tag == SIDE_DONE:
                job = self.in_flight.pop(step[1])
                self._wait(job, "wait", exposed=False)
            else:
                self._loop(step)

    def _idle_lane(self) -> int:
        """The lowest-numbered unlimited stream with nothing running or queued now."""
        network = self.network
        network.run(until_time=self.t)
        lane = OWN_STREAM_LANE
        while network.lane_busy(lane):
            lane += 1
        return lane

    def _wait(self, job: Job, wait_kind: str | None, *, exposed: bool = True) -> None:
        """Block the compute stream until ``job`` is over; the time is exposed
        communication unless ``exposed`` is False (a side kernel)."""
        if job.end is None:
            self.network.run(until_job=job)
        assert job.end is not None
        if job.end > self.t:
            waited = job.end - self.t
            if exposed:
                self.exposed += waited
            if wait_kind is not None:
                self.waits.append((job, waited))
                if self.recorder is not None:
                    self.recorder.wait(job, self.t, waited, wait_kind)
            self.t = job.end

    def _loop(self, step: Step) -> None:
        _, name, cond, body, trip, _known = step
        network = self.network
        i = 0
        while i < trip:
            network.run(until_time=self.t)
            idle_before = network.idle() and not self.in_flight
            # Compute beside a collective is slowed: such an iteration is no template.
            slowed = (
                self.interference and isinstance(network, Network) and network.collectives_pending()
            )
            before = (
                self.t, self.compute_busy, self.exposed, dict(network.busy), self.profiled,
                self.modeled,
            )  # fmt: skip
            self.program(cond.steps)
            self.program(body.steps)
            i += 1
            if i >= trip:
                continue
            compute_only = cond.compute_only and body.compute_only
            if not compute_only:
                # The iteration's time depends on collectives: it repeats exactly only
                # when it started and ended with nothing in flight.
                if not idle_before:
                    continue
                network.run(until_time=self.t)
                if not (network.idle() and not self.in_flight):
                    continue
            elif slowed:
                continue
            # Every later iteration takes exactly as long as this one: add them up.
            repeats = trip - i
            t0, busy0, exposed0, lanes0, profiled0, modeled0 = before
            duration = self.t - t0
            if self.recorder is not None:
                self.recorder.add(
                    Slice(
                        COMPUTE_LANE, f"{name}: {repeats} more iterations", "repeat", self.t,
                        duration * repeats,
                        {"kind": "repeat", "iterations": repeats,
                         "iteration_us": round(duration * 1e6, 3)},
                    )
                )  # fmt: skip
            self.t += duration * repeats
            self.compute_busy += (self.compute_busy - busy0) * repeats
            self.exposed += (self.exposed - exposed0) * repeats
            self.profiled += (self.profiled - profiled0) * repeats
            self.modeled += (self.modeled - modeled0) * repeats
            if not compute_only:
                # Idle network: its streams' busy time repeats too, and nothing is pending.
                for lane, busy in list(network.busy.items()):
                    network.busy[lane] = busy + (busy - lanes0.get(lane, 0.0)) * repeats
                network.now = self.t
            # A compute-only body leaves collectives in flight alone: they advance
            # lazily, when the compute stream next needs one.
            break
        self.program(cond.steps)

    def finish(self) -> None:
        """Let collectives nobody waits for (fired p2p) drain; they do not extend the step."""
        for job in self.in_flight.values():
            self._wait(job, "wait")
        self.in_flight.clear()
        self.network.run(until_time=self.t)
