"""What PyMC's sampler tells a step about the chain it is starting, read in one place.

PyMC 6 calls ``step.setup_chain(rng, tune, draws)``. PyMC 5 only calls ``step.set_rng(rng)``
at the start of each chain, from ``pymc.sampling.mcmc._iter_sample`` (sequential chains; its
``draws`` already includes ``tune``) or from ``pymc.sampling.parallel._Process._start_loop``
(worker processes; ``_draws`` excludes ``_tune``), possibly through ``CompoundStep.set_rng``
when the step is one of several. :func:`chain_setup_from_caller` reads those frames, so that a
chain reserves exactly the iterations it will run and knows whether it runs beside another step.
If PyMC's internals change so that nothing is found, the fields are ``None`` and the caller
falls back to what it was told explicitly (``pymc_dp.sample``, ``step.sampling_kwargs``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["ChainSetup", "chain_setup_from_caller"]

_MAX_FRAMES = 6


@dataclass(frozen=True)
class ChainSetup:
    """``iterations`` (tune + draws) and ``tune`` of the chain, and the compound step around it."""

    iterations: int | None = None
    tune: int | None = None
    compound: Any = None


def _as_count(value: Any) -> int | None:
    try:
        count = int(value)
    except (TypeError, ValueError):
        return None
    return count if count >= 0 else None


def chain_setup_from_caller(depth: int = 2) -> ChainSetup:
    """Inspect the frames above the caller (``set_rng``) for PyMC 5's chain setup."""
    from pymc.step_methods.compound import CompoundStep

    try:
        frame = sys._getframe(depth)
    except ValueError:
        return ChainSetup()
    compound = None
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        name = frame.f_code.co_name
        owner = frame.f_locals.get("self")
        if isinstance(owner, CompoundStep):
            compound = owner
        elif name == "_iter_sample":
            iterations = _as_count(frame.f_locals.get("draws"))
            tune = _as_count(frame.f_locals.get("tune"))
            return ChainSetup(iterations, tune, compound)
        elif name == "_start_loop" and owner is not None:
            draws = _as_count(getattr(owner, "_draws", None))
            tune = _as_count(getattr(owner, "_tune", None))
            if draws is not None and tune is not None:
                return ChainSetup(draws + tune, tune, compound)
            return ChainSetup(None, None, compound)
        frame = frame.f_back
    return ChainSetup(None, None, compound)
