"""Argument checks shared by the accounting modules.

Every check raises :class:`~pymc_dp.errors.InvalidParameterError` with a message that names the
argument, shows the value received and says what to change.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from pymc_dp.errors import InvalidParameterError

__all__: list[str] = []


def _is_real_scalar(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_epsilon(epsilon: object, name: str = "epsilon") -> float:
    """Return ``epsilon`` as a float after checking it is finite and > 0."""
    if not _is_real_scalar(epsilon):
        raise InvalidParameterError(f"{name} must be a positive finite number; got {epsilon!r}.")
    value = float(epsilon)  # type: ignore[arg-type]
    if not math.isfinite(value) or value <= 0.0:
        raise InvalidParameterError(
            f"{name} must be a positive finite number; got {value!r}. "
            f"Pass the privacy budget epsilon > 0 (e.g. {name}=1.0)."
        )
    return value


def check_delta(delta: object, name: str = "delta") -> float:
    """Return ``delta`` as a float after checking 0 < delta < 1."""
    if not _is_real_scalar(delta):
        raise InvalidParameterError(f"{name} must be a number in (0, 1); got {delta!r}.")
    value = float(delta)  # type: ignore[arg-type]
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise InvalidParameterError(
            f"{name} must lie strictly between 0 and 1; got {value!r}. "
            f"A common choice is {name} = 0.1 / n for n rows of data."
        )
    return value


def check_positive(value: object, name: str, *, hint: str = "") -> float:
    """Return ``value`` as a float after checking it is finite and > 0."""
    if not _is_real_scalar(value):
        raise InvalidParameterError(
            f"{name} must be a positive finite number; got {value!r}.{hint}"
        )
    out = float(value)  # type: ignore[arg-type]
    if not math.isfinite(out) or out <= 0.0:
        raise InvalidParameterError(f"{name} must be a positive finite number; got {out!r}.{hint}")
    return out


def check_int(value: object, name: str, *, minimum: int, hint: str = "") -> int:
    """Return ``value`` as an int after checking it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            as_float = float(value)
            if math.isfinite(as_float) and as_float.is_integer():
                value = int(as_float)
            else:
                raise InvalidParameterError(
                    f"{name} must be an integer >= {minimum}; got {value!r}.{hint}"
                )
        else:
            raise InvalidParameterError(
                f"{name} must be an integer >= {minimum}; got {value!r}.{hint}"
            )
    out = int(value)  # type: ignore[arg-type]
    if out < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}; got {out}.{hint}")
    return out


def as_float_array(value: object, name: str) -> np.ndarray:
    """Convert ``value`` to a float array, refusing NaN."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{name} must be a number or an array of numbers.") from exc
    if np.any(np.isnan(arr)):
        raise InvalidParameterError(f"{name} contains NaN; pass finite numbers.")
    return arr
