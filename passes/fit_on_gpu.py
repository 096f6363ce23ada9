"""fit-on-gpu: lower K where the NCCL kernels the assignment may keep in flight together
would not fit on the GPU at once, the co-residency the deadlock rule relies on
(:func:`xla_streams.simulate.residency.fit_on_gpu` says how)."""

from __future__ import annotations

from dataclasses import dataclass

from xla_streams.option import choice, option
from xla_streams.passes.base import Compilation, Fact, ModulePass, PipelineError
from xla_streams.simulate.residency import fit_on_gpu
from xla_streams.simulate.targets import TARGETS, get_target


@dataclass(frozen=True)
class FitOnGpu(ModulePass):
    name = "fit-on-gpu"
    requires = frozenset({Fact.ASYNC_PAIRS, Fact.STREAMS_ASSIGNED})
    ensures = frozenset({Fact.STREAMS_ASSIGNED})

    gpu: str = option(
        "h100", choice(tuple(TARGETS)),
        "The GPU whose SMs the NCCL kernels in flight together must fit on (its NCCL "
        "channels and SM count): K is lowered to the largest that fits.",
    )  # fmt: skip

    def run(self, compilation: Compilation) -> None:
        assert compilation.assignment is not None
        if Fact.STREAMS_VERIFIED in compilation.facts:
            # What was verified (and maybe annotated or lowered) is not what it may give.
            raise PipelineError(
                "pass 'fit-on-gpu' may change the stream assignment: put it before 'verify-streams'"
            )
        compilation.assignment = fit_on_gpu(
            compilation.module, compilation.pairs, compilation.assignment, get_target(self.gpu)
        )
