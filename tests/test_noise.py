"""The secret noise source: cryptographic by default, snapped releases, exact distributions."""

from __future__ import annotations

import os

import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_dp
import pymc_dp.noise as noise_module
from pymc_dp.noise import GRID_BITS, NoiseSource, snapping_grid


def test_the_default_source_draws_from_the_operating_systems_csprng(monkeypatch):
    calls = []

    def recording_urandom(n):
        calls.append(n)
        return np.random.default_rng(0).bytes(n)  # anything: the test is where the bits come from

    monkeypatch.setattr(noise_module.os, "urandom", recording_urandom)
    source = NoiseSource()
    assert source.secure and not source.reproducible
    source.release(np.zeros(3), 1.0)
    source.rows(1000, 10)
    assert calls, "a secure release must read os.urandom"
    # and no NumPy bit generator is involved at all
    monkeypatch.setattr(np.random, "PCG64", None)
    NoiseSource().release(1.0, 2.0)


def test_a_step_uses_secure_noise_unless_told_otherwise():
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=np.random.default_rng(1).normal(size=200))
        budget = pymc_dp.PrivacyBudget(epsilon=5.0, delta=1e-5)
        step = pymc_dp.DPPenalty(budget=budget, llr_clip=5.0, noise_multiplier=2.0)
        fast = pymc_dp.DPPenalty(
            budget=budget, llr_clip=5.0, noise_multiplier=2.0, secure_noise=False
        )
    assert step.noise.secure and step.privacy_metadata()["dp_secure_noise"] == 1
    assert not fast.noise.secure and fast.privacy_metadata()["dp_secure_noise"] == 0
    with pytest.raises(pymc_dp.InvalidParameterError, match="secure_noise"):
        with pm.Model():
            mu = pm.Normal("mu", 0, 10)
            pm.Normal("y", mu, 1, observed=np.zeros(10))
            pymc_dp.DPPenalty(budget=budget, llr_clip=5.0, noise_multiplier=2.0, secure_noise=1)


def test_fast_noise_is_flagged_first_by_the_privacy_report(capsys):
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=np.random.default_rng(1).normal(size=200))
        step = pymc_dp.DPPenalty(
            budget=pymc_dp.PrivacyBudget(epsilon=50.0, delta=1e-5),
            llr_clip=5.0,
            noise_multiplier=2.0,
            proposal_scale=0.07,
            secure_noise=False,
        )
        idata = pymc_dp.sample(
            step, chains=1, tune=5, draws=5, progressbar=False, compute_convergence_checks=False
        )
    capsys.readouterr()
    meta = pymc_dp.privacy_report(idata)
    assert meta["dp_secure_noise"] == 0
    assert capsys.readouterr().out.lstrip().startswith("NOT SECURE")


@pytest.mark.parametrize("scale", [1e-7, 0.3, 1.0, 7.5, 3e4])
def test_a_secure_release_is_the_value_plus_gaussian_noise_snapped_to_the_public_grid(scale):
    grid = snapping_grid(scale)
    assert scale / 2 ** (GRID_BITS + 1) < grid <= scale / 2**GRID_BITS
    assert np.log2(grid) == np.round(np.log2(grid))  # a power of two
    source = NoiseSource(1)
    value = np.full(40_000, 123.456 * scale)
    released = source.release(value, scale)
    # the documented form: every released number is an integer multiple of the grid
    assert np.all(released / grid == np.round(released / grid))
    # and the noise is N(0, σ²) up to the rounding (|U| ≤ g/2 ≤ σ/512)
    z = (released - value) / scale
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / z.size)


def test_fast_noise_is_not_snapped():
    released = NoiseSource(1, secure=False).release(np.zeros(1000), 1.0)
    grid = snapping_grid(1.0)
    assert not np.all(released / grid == np.round(released / grid))


def test_secure_gaussian_draws_match_the_normal_distribution_into_the_tails():
    z = NoiseSource(2).standard_normal(400_000)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    # tails: the share beyond 4 sd (6.3e-5) is right within 5 binomial sd on each side
    for side in (z, -z):
        expected = stats.norm.sf(4.0) * z.size
        assert abs(np.sum(side > 4.0) - expected) < 5 * np.sqrt(expected)
    # symmetric sign bit, no gaps near zero (resolution far below the snapping grid)
    assert abs(np.mean(z > 0) - 0.5) < 5 * np.sqrt(0.25 / z.size)
    small = np.sort(np.abs(z))[:1000]
    assert small[0] < 1e-4 and np.all(np.diff(small) < 1e-3)


def test_a_penalty_release_stays_exact_to_the_documented_tolerance():
    # the penalty correction needs E[exp(release − value − σ²/2)] = 1 (Gaussian noise): snapping
    # changes it by at most g²/24 ≤ σ²·2⁻¹⁶/24; the Monte Carlo check sees nothing
    sigma = 0.8
    released = NoiseSource(3).release(np.zeros(400_000), sigma)
    w = np.exp(released - sigma**2 / 2)
    assert abs(w.mean() - 1) < 5 * w.std() / np.sqrt(w.size)


def test_seeded_secure_noise_is_reproducible_and_restorable():
    a, b, c = NoiseSource(5), NoiseSource(5), NoiseSource(6)
    assert np.array_equal(a.standard_normal(10), b.standard_normal(10))
    assert not np.array_equal(a.standard_normal(10), c.standard_normal(10))
    state = a.state
    first = a.rows(50, 10)
    a.state = state
    assert np.array_equal(a.rows(50, 10), first)
    assert NoiseSource().state is None


@pytest.mark.parametrize(("n", "size"), [(10, 3), (7, 6), (10_000, 50)])
def test_secret_batches_are_uniform_subsets(n, size):
    source = NoiseSource(7)
    draws = [source.rows(n, size) for _ in range(4000)]
    assert all(len(np.unique(r)) == size and r.min() >= 0 and r.max() < n for r in draws)
    # every row equally likely: inclusion counts Binomial(4000, size/n), whose spread is
    # (1 − size/n) times the multinomial one the chi-square assumes (a conservative test)
    counts = np.bincount(np.concatenate(draws), minlength=n)
    assert stats.chisquare(counts).pvalue > 1e-4
    # pairs too: rows 0 and 1 together as often as for a uniform subset
    both = np.mean([(0 in r) and (1 in r) for r in draws])
    expected = size * (size - 1) / (n * (n - 1))
    assert abs(both - expected) < 5 * np.sqrt(expected * (1 - expected) / 4000) + 1e-12


def test_categorical_draws_follow_their_probabilities():
    p = np.array([0.1, 0.6, 0.3])
    draws = NoiseSource(8).choice(3, 30_000, p=p)
    assert stats.chisquare(np.bincount(draws, minlength=3), 30_000 * p).pvalue > 1e-4


def test_a_pickled_source_carries_no_secret_bytes():
    import pickle

    source = NoiseSource()
    source.standard_normal(3)  # fills the buffer
    source.standard_normal()  # and the single draws made ahead
    copy = pickle.loads(pickle.dumps(source))
    assert copy._bits._buffer == b"" and len(pickle.dumps(source)) < 2000
    assert copy._ahead == [] and len(source._ahead) > 0
    # the copy draws its own: none of the original's draws made ahead comes out of it
    assert not set(copy.standard_normal() for _ in range(50)) & set(source._ahead)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_process_never_hands_out_its_parents_draws():
    # the draws made ahead and the bytes fetched ahead are the parent's: a forked child (a
    # worker of a forking pool) draws its own
    source = NoiseSource()
    source.standard_normal()  # fills both buffers in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next draws and bytes, to the parent, then exit at once
        try:
            child = [source.standard_normal() for _ in range(20)]
            os.write(write, np.array(child).tobytes() + source._bits.take(64))
        finally:
            os._exit(0)
    os.close(write)
    received = b""
    while chunk := os.read(read, 4096):
        received += chunk
    os.close(read)
    os.waitpid(pid, 0)
    child_draws, child_bytes = np.frombuffer(received[:160]), received[160:]
    parent_draws = [source.standard_normal() for _ in range(20)]
    assert len(child_bytes) == 64
    assert not set(child_draws.tolist()) & set(parent_draws)
    assert child_bytes != source._bits.take(64)


def test_single_draws_from_os_entropy_are_the_array_draws_of_the_same_bytes(monkeypatch):
    # single draws are made ahead in blocks: each is handed out once, in order, none skipped
    def stream():
        rng = np.random.default_rng(4)
        return lambda n: rng.bytes(n)

    monkeypatch.setattr(noise_module.os, "urandom", stream())
    single = [NoiseSource().standard_normal()]
    source = NoiseSource()
    single += [source.standard_normal() for _ in range(699)]  # crosses two refills
    monkeypatch.setattr(noise_module.os, "urandom", stream())
    first = NoiseSource().standard_normal(1)
    expected = np.concatenate([first, NoiseSource().standard_normal(699)])
    assert all(isinstance(z, float) for z in single)
    np.testing.assert_array_equal(single, expected)


def test_a_scalar_release_is_the_array_release_of_the_same_bits():
    # every ratio release is a scalar, drawn on Python integers: the same bits must give the
    # same draw and the same snapped value as the array path (both from seeded sources)
    scalar, array = NoiseSource(11), NoiseSource(11)
    draws = [scalar.standard_normal() for _ in range(5000)]
    np.testing.assert_array_equal(draws, [array.standard_normal(1)[0] for _ in range(5000)])
    assert stats.kstest(draws, "norm").pvalue > 1e-3
    scalar, array = NoiseSource(12), NoiseSource(12)
    for value, scale in [(0.0, 1.0), (-3.7, 0.01), (1e6, 250.0), (2.5e-3, 1e-5)] * 500:
        released = scalar.release(value, scale)
        expected = array.release(np.array([value]), scale)[0]
        assert isinstance(released, float) and released == expected
        assert not (released == 0.0 and np.signbit(released))  # never a negative zero


def test_os_bytes_are_handed_out_once_across_refills(monkeypatch):
    counter = iter(range(10**6))
    monkeypatch.setattr(
        noise_module.os, "urandom", lambda n: bytes(next(counter) % 256 for _ in range(n))
    )
    bits = noise_module._OSBits()
    taken = b"".join(bits.take(k) for k in [16, 8, 4000, 100, 5000, 16] * 3)
    expected = bytes(i % 256 for i in range(len(taken)))
    assert taken == expected  # consecutive bytes of the stream: none repeated, none skipped


def test_a_snapped_release_is_a_grid_point_never_a_negative_zero():
    # −0.0 would tell that the noisy value was in (−g/2, 0): more than the grid point
    released = NoiseSource(4).release(np.zeros(100_000), 1.0)
    zeros = released[released == 0.0]
    assert zeros.size > 50 and not np.any(np.signbit(zeros))
