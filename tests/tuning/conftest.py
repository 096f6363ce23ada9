"""What the tuner's tests share: a disk cache of compiles of their own, so no test
reads what another run (or another checkout) left in ~/.cache, and none leaves
anything there."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from xla_streams.environment import CACHE_DIR


@pytest.fixture(scope="session", autouse=True)
def _own_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_DIR.env or "", os.fspath(tmp_path_factory.mktemp("compile_cache")))
        yield
