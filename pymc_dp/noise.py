"""The secret noise source: where DP noise and secret minibatch choices come from (theory §2).

Noise never comes from the user's ``random_seed``: an adversary who knows the noise seed can
subtract the noise. Two kinds of source exist (docs: security.md):

* **Secure** (the default). Random bits from the operating system's cryptographically secure
  generator (:func:`os.urandom`, the kernel's CSPRNG). A Gaussian draw uses 128 of them: one
  sign bit and a uniform ``u`` on ``(0, ½)`` with 127 bits, so ``u`` has full *relative*
  precision (53 bits) down to ``2⁻⁷⁶``; the draw is ``±Φ⁻¹(u)`` (inverse CDF, SciPy's
  ``ndtri``). Its error against an exact Gaussian draw is below ``10⁻¹⁴ · max(1, |Z|)`` out to
  10.4 sd (``u ≥ 2⁻⁷⁶``; beyond, probability ``2.6·10⁻²³`` per draw), where Box–Muller from
  53-bit uniforms stops at 8.6 sd. Every continuous release is then **snapped** to a
  public grid (:meth:`NoiseSource.release`, the floating-point mitigation against Mironov's
  attack on the low-order bits of ``x + noise``).
* **Fast** (``secure=False``, research only). NumPy's PCG64 seeded from OS entropy, no
  snapping: what pymc_dp did before. It is recorded in the privacy metadata and flagged first
  by :func:`~pymc_dp.privacy_report`.

A fixed ``seed`` makes either kind reproducible (tests and research; also flagged): the secure
kind then draws its bits from SHAKE-256 keyed by the seed (in counter mode), so the same code path
(inverse CDF, snapping, rejection sampling of rows) runs as with OS entropy.

NumPy and SciPy only: kernels and mechanisms import this module without importing PyMC.
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

__all__ = ["GRID_BITS", "NoiseSource", "snapping_grid"]

#: A release with noise sd ``σ`` is snapped to multiples of ``2^(⌊log₂ σ⌋ − GRID_BITS)``.
GRID_BITS = 8
_TWO64 = 2.0**64
_TWO128 = 2.0**128
_BLOCK = 4096  # bytes fetched from the bit source at a time
#: Single Gaussian draws from OS entropy are made this many at a time, each handed out once
#: (a ratio release per iteration then costs a list pop, not a scalar inverse CDF).
_NORMAL_BLOCK = 256


def snapping_grid(scale: float) -> float:
    """The public grid of a release with noise sd ``scale``: ``g = 2^(⌊log₂ σ⌋ − GRID_BITS)``.

    ``σ/512 < g ≤ σ/256``. It depends on ``σ`` only (public), never on the value released.
    """
    return math.ldexp(1.0, math.floor(math.log2(scale)) - GRID_BITS)


class _OSBits:
    """Bytes from the operating system's CSPRNG, fetched in blocks; a byte is handed out once
    (used ones are dropped at the next refill, and never pickled)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._used = 0  # bytes of the buffer already handed out (never handed out again)
        self._pid = os.getpid()

    def take(self, n: int) -> bytes:
        if getattr(self, "_pid", None) != os.getpid():  # a forked copy: the parent has these
            self.__init__()
        start = self._used
        if start + n > len(self._buffer):
            self._buffer, start = self._buffer[start:] + os.urandom(max(_BLOCK, n)), 0
        self._used = start + n
        return self._buffer[start : start + n]

    def __getstate__(self) -> dict:
        return {"_buffer": b"", "_used": 0, "_pid": -1}  # a copy draws its own; none travel

    @property
    def state(self) -> None:
        return None


class _KeyedBits:
    """A reproducible cryptographic stream: request k is SHAKE-256(key ‖ k)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._counter = 0

    def take(self, n: int) -> bytes:
        block = hashlib.shake_256(self._key + self._counter.to_bytes(16, "little")).digest(n)
        self._counter += 1
        return block

    @property
    def state(self) -> int:
        return self._counter

    @state.setter
    def state(self, value: int) -> None:
        self._counter = int(value)


class NoiseSource:
    """A secret generator for DP noise and other secret choices (e.g. minibatch rows).

    Parameters
    ----------
    seed : int or numpy.random.SeedSequence, optional
        ``None`` (default): fresh OS entropy — the only private choice. An integer or seed
        sequence makes the noise reproducible (tests, research), which :attr:`reproducible`
        records.
    secure : bool
        ``True`` (default): cryptographic bits, inverse-CDF Gaussians and snapped releases
        (module docstring). ``False``: NumPy's PCG64 and no snapping (research only).
    """

    def __init__(
        self, seed: int | np.random.SeedSequence | None = None, *, secure: bool = True
    ) -> None:
        self.reproducible = seed is not None
        self.secure = bool(secure)
        if isinstance(seed, np.random.SeedSequence):
            self._seq = seed
        else:
            self._seq = np.random.SeedSequence(seed)
        if self.secure:
            if self.reproducible:
                key = self._seq.generate_state(8, np.uint32).tobytes()
                self._bits: _OSBits | _KeyedBits | None = _KeyedBits(key)
            else:
                self._bits = _OSBits()
            self._pcg = None
        else:
            self._bits = None
            self._pcg = np.random.Generator(np.random.PCG64(self._seq))
        # single draws made ahead, OS entropy only (a seeded source's state is its counter),
        # in the process that made them
        self._ahead: list[float] | None = [] if isinstance(self._bits, _OSBits) else None
        self._ahead_pid = os.getpid()

    @classmethod
    def for_chain(
        cls, seed: int | None, public_rng: np.random.Generator, *, secure: bool = True
    ) -> NoiseSource:
        """The noise source of one chain.

        ``seed=None``: fresh OS entropy, whatever the public generator (the private choice).
        Otherwise (reproducible noise) the seed is mixed with a digest of the chain's public
        generator state, so that chains seeded differently by PyMC get different noise.
        """
        if seed is None:
            return cls(secure=secure)
        digest = hashlib.sha256(repr(public_rng.bit_generator.state).encode()).digest()
        words = np.frombuffer(digest, dtype=np.uint32).tolist()
        return cls(np.random.SeedSequence([int(seed), *words]), secure=secure)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if state.get("_ahead") is not None:
            state["_ahead"] = []  # a copy draws its own; no draw travels in a pickle
        return state

    def spawn(self, n: int) -> list[NoiseSource]:
        """Independent child sources (one per chain), reproducible iff this one is."""
        children = []
        for seq in self._seq.spawn(n):
            child = NoiseSource(seq if self.reproducible else None, secure=self.secure)
            children.append(child)
        return children

    # ------------------------------------------------------------------ state (seeded only)

    @property
    def state(self) -> object:
        """The generator's state when reproducible (to restore a chain), else ``None``."""
        if not self.reproducible:
            return None
        if self._pcg is not None:
            return self._pcg.bit_generator.state
        return self._bits.state

    @state.setter
    def state(self, value: object) -> None:
        if not self.reproducible:
            return
        if self._pcg is not None:
            self._pcg.bit_generator.state = value
        else:
            self._bits.state = value

    # ------------------------------------------------------------------ draws

    def _uint64(self, k: int) -> NDArray[np.uint64]:
        return np.frombuffer(self._bits.take(8 * k), dtype="<u8").astype(np.uint64)

    def standard_normal(self, size: int | tuple[int, ...] | None = None) -> float | NDArray:
        """``N(0, 1)`` draws (inverse CDF of a 127-bit uniform and a sign bit when secure)."""
        if self._pcg is not None:
            return self._pcg.standard_normal(size)
        if size is None and self._ahead is not None:  # one draw (every ratio release)
            if self._ahead_pid != os.getpid():  # a forked copy: the parent's are not its own
                self._ahead, self._ahead_pid = [], os.getpid()
            if not self._ahead:  # reversed: popped from the end, handed out in order
                self._ahead = self._normals(_NORMAL_BLOCK)[::-1].tolist()
            return self._ahead.pop()
        if size is None:  # a seeded source: the same arithmetic on Python ints, one at a time
            bits = self._bits.take(16)
            hi, lo = int.from_bytes(bits[:8], "little"), int.from_bytes(bits[8:], "little")
            u = float(hi & 0x7FFFFFFFFFFFFFFF) / _TWO64 + (float(lo) + 0.5) / _TWO128
            z = -float(ndtri(u))
            return -z if hi >> 63 else z
        return self._normals(int(np.prod(size))).reshape(size)

    def _normals(self, k: int) -> NDArray[np.float64]:
        """``k`` draws ``±Φ⁻¹(u)`` from ``k`` × 128 bits (module docstring)."""
        words = self._uint64(2 * k)
        hi, lo = words[0::2], words[1::2]
        negative = (hi >> np.uint64(63)).astype(bool)
        magnitude = hi & np.uint64(0x7FFFFFFFFFFFFFFF)
        # u = (K + ½) / 2¹²⁸ for K uniform on [0, 2¹²⁷): on (0, ½), full relative precision
        u = magnitude.astype(float) / _TWO64 + (lo.astype(float) + 0.5) / _TWO128
        z = -ndtri(u)  # ≥ 0
        return np.where(negative, -z, z)

    def normal(self, scale: float | np.ndarray, size: int | None = None) -> float | np.ndarray:
        """Draw ``N(0, scale²)`` noise (not snapped: use :meth:`release` for a release)."""
        return scale * self.standard_normal(size)

    def random(self, size: int | tuple[int, ...] | None = None) -> float | NDArray[np.float64]:
        """Uniform draws on ``(0, 1)`` (53 bits)."""
        if self._pcg is not None:
            return self._pcg.random(size)
        k = 1 if size is None else int(np.prod(size))
        u = ((self._uint64(k) >> np.uint64(11)).astype(float) + 0.5) / 2.0**53
        return float(u[0]) if size is None else u.reshape(size)

    def choice(
        self, a: int, size: int | tuple[int, ...] | None = None, *, p: NDArray[np.float64]
    ) -> int | NDArray[np.int64]:
        """Categorical draws on ``0..a-1`` with probabilities ``p`` (inverse CDF)."""
        if self._pcg is not None:
            return self._pcg.choice(a, size=size, p=p)
        cumulative = np.cumsum(p)
        cumulative /= cumulative[-1]
        index = np.minimum(np.searchsorted(cumulative, self.random(size), side="right"), a - 1)
        return int(index) if size is None else index

    def release(self, value: float | np.ndarray, scale: float) -> float | NDArray[np.float64]:
        """The Gaussian mechanism's output ``value + N(0, scale² I)``, snapped when secure.

        Secure: ``round((value + σZ) / g) · g`` with the public grid ``g`` of
        :func:`snapping_grid` — a deterministic function of the exact sum (IEEE addition is
        correctly rounded), so its privacy is that of the Gaussian mechanism up to the draw's
        own error: each output's probability is within a factor ``1 ± η`` of the ideal one,
        ``η ≤ 2 · 10⁻¹⁴ · max(1, |Z|) / (g/σ) ≲ 10⁻¹¹ · max(1, |Z|)`` (docs: security.md). The
        rounding adds at most ``g/2 ≤ σ/512`` to the noise.
        """
        shape = () if isinstance(value, float) else np.shape(value)
        noisy = value + scale * self.standard_normal(shape or None)
        if not self.secure or scale == 0.0:
            return noisy
        grid = snapping_grid(scale)
        if not shape and math.isfinite(noisy / grid):  # round half to even, as np.round
            return float(round(noisy / grid) * grid)
        # + 0.0 turns a snapped −0.0 (a noisy value in (−g/2, 0)) into +0.0: the grid point only
        snapped = np.round(np.asarray(noisy) / grid) * grid + 0.0
        return snapped if shape else float(snapped)

    def rows(self, n: int, size: int) -> np.ndarray:
        """A secret batch: ``size`` of ``n`` row indices drawn uniformly without replacement."""
        if self._pcg is not None:
            return self._pcg.choice(n, size=size, replace=False)
        if 4 * size > n:
            # uniform keys, the `size` smallest: a uniform subset (ties have probability < n²/2⁶⁴)
            keys = self._uint64(n)
            return np.sort(np.argpartition(keys, size - 1)[:size])
        # x mod n of random words below the largest multiple of n (exactly uniform); each round
        # draws as many rows as are missing and keeps the distinct ones, until `size` are in
        # hand. Every step is symmetric under relabelling the rows, so the subset is uniform.
        wide = n > 2**32
        dtype, span = ("<u8", 2**64) if wide else ("<u4", 2**32)
        limit = (span // n) * n - 1
        chosen = np.empty(0, dtype=np.int64)
        while chosen.size < size:
            missing = size - chosen.size
            words = np.frombuffer(self._bits.take(missing * (8 if wide else 4)), dtype=dtype)
            candidates = (words[words <= limit] % n).astype(np.int64)
            merged = np.sort(np.concatenate([chosen, candidates]), kind="stable")
            chosen = merged[np.concatenate([[True], merged[1:] != merged[:-1]])]
        return chosen

    def __repr__(self) -> str:
        kind = "reproducible (seeded)" if self.reproducible else "OS entropy"
        generator = "secure" if self.secure else "fast, not secure"
        return f"NoiseSource({kind}, {generator})"
