"""Shared by the tests of the CUDA backend on the emulated CUDA runtime and NCCL
(``make cuda-emulated``): the built emulator and backend, and replays of lowered
programs through ``xsim-replay``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xla_streams.pipeline import build_pipeline
from xla_streams.plugin.hook import run_pipeline
from xla_streams.runtime import build as runtime_build
from xla_streams.runtime import emulator
from xla_streams.runtime.emulator import replay


@pytest.fixture(scope="session")
def built() -> emulator.Built:
    return emulator.build()


@pytest.fixture(scope="session")
def backend() -> Path:
    """libxla_streams_cuda as ``python -m xla_streams.runtime.build --cuda`` builds it."""
    return runtime_build.build("cuda")


@pytest.fixture(scope="session")
def lower() -> Callable[..., str]:
    """``lower(text, streams=4)``: the module lowered for the CUDA runtime, as the
    plugin's ffi mode lowers it."""

    def lowered(text: str, streams: int = 4) -> str:
        return run_pipeline(text, build_pipeline(streams, runtime="cuda")).module.print()

    return lowered


@pytest.fixture
def run_replay(built: emulator.Built, backend: Path, tmp_path: Path) -> Callable[..., Any]:
    """``run_replay(plan, backend=..., env=..., **script_options)``: one process's
    script of ``plan`` played through the backend; the replay's JSON result."""

    def run(
        plan: replay.Plan,
        backend: Path = backend,
        env: dict[str, str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        path = tmp_path / "replay.txt"
        path.write_text(plan.script(**options))
        return built.replay(path, backend, env)

    return run
