"""Compiling candidates on a Ray cluster (``xla-streams tune --ray=auto|ADDRESS``).

One Ray actor per worker holds the compile-only topology (built once) and compiles
the candidates it is sent; the cluster's nodes need this package and JAX's CUDA
plugin installed (the ``gpu-aot`` extra), no GPU. Ray is an extra
(``pip install 'xla-streams[ray]'``) imported only here.

Ray's own behaviour, from research on ray 2.60 (state it to whoever runs this):
``ray.init`` starts a cluster of about nine processes (0.6 GiB) when none is running,
whose servers listen on every interface (the node's address, not loopback: Ray
rewrites 127.0.0.1), and its dashboard posts usage statistics to
``usage-stats.ray.io`` unless ``RAY_USAGE_STATS_ENABLED=0``. So this module sets
``RAY_USAGE_STATS_ENABLED=0`` before importing Ray unless it is set, and ``auto``
only connects to a running cluster (``ray start --head``): it never starts one.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from xla_streams.tuning.cache import Compiled, Refused
from xla_streams.tuning.compiling import ProgramSource, Topology, compile_source
from xla_streams.tuning.result import TuneError, first_line


class _Worker:
    """What each Ray actor runs: the topology once, then one compile per call."""

    def __init__(self, source: ProgramSource) -> None:
        os.environ["JAX_PLATFORMS"] = "cpu"
        self.source = source
        self.devices = Topology(source).devices

    def compile(self, options: Mapping[str, object]) -> Compiled | Refused:
        return compile_source(self.source, self.devices, options)


def _ray() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        ray = importlib.import_module("ray")
    except ImportError:
        raise TuneError("--ray needs Ray: pip install 'xla-streams[ray]'") from None
    return ray


class RayCompiler:
    """Compiles on ``workers`` Ray actors of the cluster at ``address`` (``auto``: the one
    ``ray start`` runs here or RAY_ADDRESS names). ``workers`` defaults to the cluster's
    CPUs (one compile per CPU)."""

    def __init__(self, source: ProgramSource, address: str, workers: int | None = None) -> None:
        ray = _ray()
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            except Exception as e:
                raise TuneError(f"--ray={address}: cannot connect: {first_line(e)}") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, workers if workers is not None else cpus)
        actor = ray.remote(num_cpus=1)(_Worker)
        self._actors = [actor.remote(source) for _ in range(self.workers)]

    def compile_many(self, options: Sequence[Mapping[str, object]]) -> list[Compiled | Refused]:
        refs = [
            self._actors[i % len(self._actors)].compile.remote(dict(o))
            for i, o in enumerate(options)
        ]
        out: list[Compiled | Refused] = []
        for ref in refs:
            try:
                out.append(self._ray.get(ref))
            except Exception as e:  # an actor died: say so, go on
                out.append(Refused(f"the Ray compile worker failed: {first_line(e)}"))
        return out

    def will_compile(self, options: Mapping[str, object]) -> bool:
        return True

    def close(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
        if self._owns:
            self._ray.shutdown()
