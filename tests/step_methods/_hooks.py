"""The only place the conformance suite touches a step's internals."""

from __future__ import annotations

from typing import Any


def data_reads(step: Any) -> int:
    """Passes over (subsets of) the rows so far (instrumentation, not data)."""
    return step._channel.reads


def _normalised(events: Any) -> dict:
    # Gaussian events compose into one μ (a reservation holds their sum): compare by μ
    out: dict = {}
    for event, count in events.items():
        if event.is_gaussian():
            out["gaussian_mu"] = round(out.get("gaussian_mu", 0.0) + count * event.gaussian_mu(), 9)
        else:
            out[event] = out.get(event, 0) + count
    return out


def releases_made(step: Any) -> dict:
    """What the step's current chain released: total Gaussian μ, other events by count."""
    return _normalised(step.counter.released)


def releases_allowed(step: Any) -> dict:
    """What this chain's reservations cover, in the units of :func:`releases_made`."""
    return _normalised(step.counter.allowed)


def break_penalty(monkeypatch: Any) -> None:
    """Negative control: drop the −σ²/2 penalty term from the step's kernel."""
    import pymc_dp.step_methods.hmc as hmc
    import pymc_dp.step_methods.penalty as penalty

    for module, params in ((penalty, "PenaltyParams"), (hmc, "HMCParams")):
        original = getattr(module, params)

        def without_penalty(*args, _original=original, **kwargs):
            return _original(*args, **kwargs)._replace(penalty=False)

        monkeypatch.setattr(module, params, without_penalty)
