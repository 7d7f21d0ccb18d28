"""One validator per kind of step option, shared by every DP step (PyMC-style messages).

Each function returns the value in its canonical type or raises
:class:`~pymc_dp.errors.InvalidParameterError` naming the argument, the value given and what is
accepted. No silent fallback: ``target_accept=0`` is an error, not the default.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pymc_dp.errors import InvalidParameterError

__all__ = [
    "check_batch_size",
    "check_correlation",
    "check_flag",
    "check_fraction",
    "check_noise_rng",
    "check_positive_int",
    "check_proposal_scale",
    "check_temperature",
    "noise_multiplier_from",
    "positive_float",
]


def _number(value: Any, name: str, what: str) -> float:
    """``float(value)``, refusing booleans and non-numbers with a message saying ``what``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be {what}, got {value!r}.") from None


def positive_float(value: Any, name: str) -> float:
    """A positive, finite number."""
    number = _number(value, name, "a positive number")
    if not (np.isfinite(number) and number > 0):
        raise InvalidParameterError(f"{name} must be positive and finite, got {number}.")
    return number


def check_positive_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """An integer ``≥ minimum`` (``bool`` and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise InvalidParameterError(f"{name} must be {what}, got {value!r}.")
    return int(value)


def check_fraction(value: Any, name: str) -> float:
    """A number strictly between 0 and 1 (an acceptance-rate target)."""
    number = _number(value, name, "a number in (0, 1)")
    if not 0 < number < 1:
        raise InvalidParameterError(f"{name} must be in (0, 1), got {value!r}.")
    return number


def check_correlation(value: Any) -> float | str:
    """``proposal_correlation``: ``"auto"`` or a number in ``[0, 1)``."""
    if isinstance(value, str) and value == "auto":
        return value
    number = _number(value, "proposal_correlation", '"auto" or a number in [0, 1)')
    if not 0 <= number < 1:
        raise InvalidParameterError(
            f'proposal_correlation must be "auto" or in [0, 1), got {value!r}: 0 draws '
            "independently from the Laplace approximation, values near 1 move little."
        )
    return number


def check_flag(value: Any, name: str) -> bool:
    """``True`` or ``False`` (NumPy booleans too); anything else is refused."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidParameterError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def check_noise_rng(value: Any) -> int | None:
    """``None`` (secret noise from OS entropy) or a non-negative integer seed (tests, research)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidParameterError(
            f"noise_rng must be None (DP noise from OS entropy, the only private choice) or a "
            f"non-negative integer seed for reproducible noise in tests, got {value!r}."
        )
    return int(value)


def check_batch_size(batch_size: Any) -> int:
    """An integer ``batch_size ≥ 2`` (its range against the rows is checked once ``n`` is known)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise InvalidParameterError(f"batch_size must be an integer, got {batch_size!r}.")
    if batch_size < 2:
        raise InvalidParameterError(
            f"batch_size={batch_size} must be between 2 and the number of rows n."
        )
    return int(batch_size)


def check_temperature(temperature: Any) -> float:
    """``T ∈ (0, 1]``: the likelihood is tempered, the privacy guarantee is unchanged."""
    value = _number(temperature, "temperature", "a number in (0, 1]")
    if not 0 < value <= 1:
        raise InvalidParameterError(f"temperature must be in (0, 1], got {temperature!r}.")
    return value


def check_proposal_scale(value: Any, ndim: int) -> np.ndarray:
    """A positive, finite random-walk scale per coordinate (a scalar is broadcast)."""
    try:
        scale = np.broadcast_to(np.asarray(value, dtype=float), (ndim,))
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"proposal_scale has shape {np.shape(value)}; give a positive scalar or {ndim} "
            "positive values."
        ) from None
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise InvalidParameterError("proposal_scale must be positive and finite.")
    return scale.copy()


def noise_multiplier_from(
    multiplier: Any, tau: Any, n_rows: int, *, name: str, tau_name: str
) -> float:
    """The noise multiplier ``z = σ/Δ`` from exactly one of ``multiplier`` and ``tau``.

    ``tau`` is the seeds' parametrisation ``z = τ·√n`` (theory §4.1, §4.3); ``name`` and
    ``tau_name`` are the step's argument names, used in the messages.
    """
    if (multiplier is None) == (tau is None):
        raise InvalidParameterError(
            f"Give exactly one of {name} (z = σ/Δ) and {tau_name} (the seeds' form, "
            f"z = {tau_name}·√n)."
        )
    if tau is not None:
        return positive_float(tau, tau_name) * float(np.sqrt(n_rows))
    return positive_float(multiplier, name)
