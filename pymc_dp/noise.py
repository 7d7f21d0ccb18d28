"""The secret noise source: where DP noise and secret minibatch choices come from (theory §2).

Noise comes from a generator of its own seeded from OS entropy by default and never from the
user's ``random_seed``: an adversary who knows the noise seed can subtract the noise. A fixed
``noise_rng`` makes the noise reproducible for tests and research runs; that choice is recorded
(:attr:`NoiseSource.reproducible`) and reported with the release.

NumPy only: kernels and mechanisms import this module without importing PyMC.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["NoiseSource"]


class NoiseSource:
    """A secret generator for DP noise and other secret choices (e.g. minibatch rows).

    Parameters
    ----------
    seed : int or numpy.random.SeedSequence, optional
        ``None`` (default): fresh OS entropy — the only private choice. An integer or seed
        sequence makes the noise reproducible (tests, research), which :attr:`reproducible`
        records.
    """

    def __init__(self, seed: int | np.random.SeedSequence | None = None) -> None:
        self.reproducible = seed is not None
        if isinstance(seed, np.random.SeedSequence):
            self._seq = seed
        else:
            self._seq = np.random.SeedSequence(seed)
        self.generator = np.random.Generator(np.random.PCG64(self._seq))

    @classmethod
    def for_chain(cls, seed: int | None, public_rng: np.random.Generator) -> NoiseSource:
        """The noise source of one chain.

        ``seed=None``: fresh OS entropy, whatever the public generator (the private choice).
        Otherwise (reproducible noise) the seed is mixed with a digest of the chain's public
        generator state, so that chains seeded differently by PyMC get different noise.
        """
        if seed is None:
            return cls()
        digest = hashlib.sha256(repr(public_rng.bit_generator.state).encode()).digest()
        words = np.frombuffer(digest, dtype=np.uint32).tolist()
        return cls(np.random.SeedSequence([int(seed), *words]))

    def spawn(self, n: int) -> list[NoiseSource]:
        """Independent child sources (one per chain), reproducible iff this one is."""
        children = []
        for seq in self._seq.spawn(n):
            child = NoiseSource(seq)
            child.reproducible = self.reproducible
            children.append(child)
        return children

    def normal(self, scale: float | np.ndarray, size: int | None = None) -> float | np.ndarray:
        """Draw ``N(0, scale²)`` noise."""
        return self.generator.normal(0.0, scale, size)

    def rows(self, n: int, size: int) -> np.ndarray:
        """A secret batch: ``size`` of ``n`` row indices drawn uniformly without replacement."""
        return self.generator.choice(n, size=size, replace=False)

    def __repr__(self) -> str:
        kind = "reproducible (seeded)" if self.reproducible else "OS entropy"
        return f"NoiseSource({kind})"
