"""The JAX backend (``compile_kwargs={"mode": "JAX"}``): the same values as the default backend.

Every per-row function the steps call is compared on models whose per-row graphs need the
JAX-specific handling: sizes computed from the number of rows (the banana's ``concatenate``,
whose gradient allocates a per-row matrix and splits it; the ordinal regression's ``Split``),
gathered group parameters (scatter-add), chunks of several lengths and secret row subsets.
"""

from __future__ import annotations

import importlib.util
import os
import pickle

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp import _compile, releases
from pymc_dp import oracle as oracle_module
from pymc_dp.errors import BackendNotSupportedError, InvalidParameterError
from pymc_dp.oracle import RowLikelihood
from pymc_dp.testing import Banana


def _banana(n: int, rng: np.random.Generator) -> pm.Model:
    spec = Banana(d=2, a=20.0)
    return spec.model(spec.simulate(n, rng))


def _hierarchical(n: int, rng: np.random.Generator) -> pm.Model:
    g = rng.integers(0, 8, n)
    y = rng.normal(size=8)[g] + rng.normal(size=n)
    with pm.Model() as model:
        idx = pm.Data("group_idx", g)
        mu_a = pm.Normal("mu_a", 0, 1)
        sigma_a = pm.HalfNormal("sigma_a", 1)
        a = pm.Normal("a", mu_a, sigma_a, shape=8)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a[idx], sigma, observed=y)
    return model


def _ordinal(n: int, rng: np.random.Generator) -> pm.Model:
    x = rng.normal(size=n)
    latent = 0.8 * x + rng.logistic(size=n)
    y = np.digitize(latent, [-1.0, 0.0, 1.2])
    with pm.Model() as model:
        xd = pm.Data("x", x)
        beta = pm.Normal("beta", 0, 2)
        cut = pm.Normal(
            "cut", [-1.0, 0.0, 1.0], 2, shape=3, transform=pm.distributions.transforms.ordered
        )
        pm.OrderedLogistic("y", eta=beta * xd, cutpoints=cut, observed=y, compute_p=False)
    return model


MODELS = {"banana": _banana, "hierarchical": _hierarchical, "ordinal": _ordinal}


def _pair(name: str, **kwargs) -> tuple[pm.Model, RowLikelihood, RowLikelihood]:
    model = MODELS[name](600, np.random.default_rng(3))
    default = RowLikelihood(model, **kwargs)
    on_jax = RowLikelihood(model, backend="JAX", **kwargs)
    assert on_jax.backend == "JAX" and default.backend is None
    return model, default, on_jax


@pytest.mark.parametrize("name", ["hierarchical", "ordinal"])
def test_the_log_likelihood_and_clipped_gradient_agree_with_the_default_backend(name):
    # a gathered group parameter (scatter-add); an ordinal likelihood (Split of the gradient)
    model, default, on_jax = _pair(name)
    rng = np.random.default_rng(4)
    theta = default.space.ravel(model.initial_point()) + rng.normal(0, 0.2, default.ndim)
    for rows in (None, rng.choice(600, size=50, replace=False)):
        np.testing.assert_allclose(
            on_jax.loglik_rows(theta, rows), default.loglik_rows(theta, rows), rtol=1e-10
        )
        a, b = (o.clipped_grad_sum(theta, 2.0, rows) for o in (default, on_jax))
        np.testing.assert_allclose(b.value, a.value, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", ["cpu", "accelerator"])
def test_every_per_row_function_agrees_with_the_default_backend(device, monkeypatch):
    # the banana: its concatenate's gradient allocates and splits a per-row matrix whose
    # length JAX needs as a constant. "accelerator": the path JAX takes on a GPU (the rows
    # copied to the device once, each pass slicing that copy), run here on JAX's CPU device
    monkeypatch.setattr(oracle_module, "_device_for", lambda backend: backend and device)
    rng = np.random.default_rng(3)
    # gradient chunks of 256 rows: lengths 256 and 88, two shapes per gradient function
    model, default, on_jax = _pair("banana", chunk_size=256)
    assert on_jax._device == device and default._device is None
    d = default.ndim
    theta = default.space.ravel(model.initial_point()) + rng.normal(0, 0.2, d)
    theta_new = theta + rng.normal(0, 0.05, d)
    subset = rng.choice(600, size=50, replace=False)  # a secret batch's rows
    for rows in (None, subset):
        np.testing.assert_allclose(
            on_jax.loglik_rows(theta, rows), default.loglik_rows(theta, rows), rtol=1e-10
        )
        for oracle in (default, on_jax):
            oracle.clear_cache()
        a = default.clipped_grad_sum(theta, 2.0, rows, count_clipped=True)
        b = on_jax.clipped_grad_sum(theta, 2.0, rows, count_clipped=True)
        np.testing.assert_allclose(b.value, a.value, rtol=1e-10, atol=1e-10)
        assert b.n_clipped == a.n_clipped
        a = default.clipped_llr_sum(theta, theta_new, 0.5, rows)
        b = on_jax.clipped_llr_sum(theta, theta_new, 0.5, rows)
        np.testing.assert_allclose(b.value, a.value, rtol=1e-10, atol=1e-10)
    centre = releases.Centre(theta, 3.0, np.eye(d))
    a = default.clipped_centred_llr_sum(theta, theta_new, centre, 0.5)
    b = on_jax.clipped_centred_llr_sum(theta, theta_new, centre, 0.5)
    np.testing.assert_allclose(b.value, a.value, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        on_jax.clipped_fisher(theta, 3.0, np.eye(d)),
        default.clipped_fisher(theta, 3.0, np.eye(d)),
        rtol=1e-10,
        atol=1e-10,
    )
    edges = np.geomspace(0.01, 100.0, 12)
    np.testing.assert_array_equal(
        on_jax.grad_norm_counts(theta, edges), default.grad_norm_counts(theta, edges)
    )
    if device == "accelerator":  # the device's copy: made once, JAX arrays, not pickled
        import jax

        resident = on_jax._resident
        assert resident is not None and all(isinstance(a, jax.Array) for a in resident)
        np.testing.assert_array_equal(np.asarray(resident[0]), on_jax._rows[0].data)
        assert pickle.loads(pickle.dumps(on_jax))._resident is None
    else:
        assert on_jax._resident is None  # on JAX's CPU, the chunks are the host's arrays


@pytest.mark.parametrize("name", ["hierarchical", "banana"])
def test_the_centred_releases_agree_with_the_default_backend(name):
    # the centre's clipped gradients, the centred ratio and the centred gradient sum (NumPy on
    # JAX's read-only outputs for the gathered group parameter, one compiled pass without it)
    model, default, on_jax = _pair(name, chunk_size=256)
    rng = np.random.default_rng(5)
    d = default.ndim
    theta = default.space.ravel(model.initial_point()) + rng.normal(0, 0.2, d)
    theta_new = theta + rng.normal(0, 0.05, d)
    centre = releases.Centre(theta + rng.normal(0, 0.1, d), 1.0, np.eye(d))
    kept = default.likelihood_coordinates
    metric = np.eye(kept.sum()) + 0.1 * np.tril(np.ones((kept.sum(), kept.sum())), -1)
    np.testing.assert_allclose(
        on_jax.centre_grad_sum(centre), default.centre_grad_sum(centre), rtol=1e-10, atol=1e-10
    )
    a = default.clipped_centred_llr_sum(theta, theta_new, centre, 0.5)
    b = on_jax.clipped_centred_llr_sum(theta, theta_new, centre, 0.5)
    np.testing.assert_allclose(b.value, a.value, rtol=1e-10, atol=1e-10)
    for count in (False, True):
        a = default.clipped_centred_grad_sum(theta, centre, metric, kept, 0.3, count_clipped=count)
        b = on_jax.clipped_centred_grad_sum(theta, centre, metric, kept, 0.3, count_clipped=count)
        np.testing.assert_allclose(b.value, a.value, rtol=1e-10, atol=1e-10)
        assert b.n_clipped == a.n_clipped


def test_one_function_per_chunk_length_with_the_lengths_fixed_in_the_graph():
    model = _banana(600, np.random.default_rng(0))
    oracle = RowLikelihood(model, chunk_size=256, backend="JAX", validate=False)
    theta = np.array([0.1, 0.5])
    fixed = oracle.clipped_grad_sum(theta, 1.0).value  # chunks of 256, 256, 88 rows
    assert np.all(np.isfinite(fixed))
    grad = oracle._f_grad
    assert isinstance(grad, _compile.StaticShapeFunction)
    lengths = sorted(shapes[1][0] for _, shapes in grad._functions)
    assert lengths == [88, 256]
    for (_, shapes), compiled in grad._functions.items():
        rows_input = compiled.maker.fgraph.inputs[1]
        assert rows_input.type.shape == shapes[1]  # static: sizes are constants for JAX
    # the negative control: the same gradient graph compiled for JAX without the lengths fixed
    # (as PyTensor would) cannot be traced: its per-row matrix is allocated with a length
    # that JAX sees as a traced value
    assert grad.inputs[1].type.shape[0] is None
    dynamic = _compile._compile_now(list(grad.inputs), grad.outputs, True, "JAX")
    rows = next(oracle._chunks(None, False))
    with pytest.raises(Exception):  # noqa: B017  (JAX's TypeError or ConcretizationTypeError)
        dynamic(theta, *rows, np.asarray(1.0), oracle._precond())


def test_an_operation_jax_cannot_compile_is_refused_at_build_naming_it(monkeypatch):
    real = _compile._compile_now

    def without_jax(inputs, outputs, check_bounds, backend):
        if backend == "JAX":
            raise NotImplementedError("No JAX implementation for Op fake_op")
        return real(inputs, outputs, check_bounds, backend)

    monkeypatch.setattr(_compile, "_compile_now", without_jax)
    model = _banana(100, np.random.default_rng(0))
    with pytest.raises(BackendNotSupportedError, match=r"fake_op.*compile_kwargs unset"):
        RowLikelihood(model, backend="JAX")
    RowLikelihood(model)  # the default backend is unaffected


def test_steps_share_an_oracle_only_with_the_same_backend():
    model = _hierarchical(200, np.random.default_rng(2))
    default = RowLikelihood.for_model(model)
    on_jax = RowLikelihood.for_model(model, backend="JAX")
    assert on_jax is not default and on_jax.backend == "JAX"
    assert RowLikelihood.for_model(model, backend="jax") is on_jax  # the same backend


def test_a_pickled_oracle_compiles_again_where_it_is_loaded():
    model = _hierarchical(300, np.random.default_rng(1))
    oracle = RowLikelihood(model, backend="JAX")
    theta = oracle.space.ravel(model.initial_point()) + 0.1
    expected = oracle.clipped_grad_sum(theta, 1.0).value
    copy = pickle.loads(pickle.dumps(oracle))
    assert copy._f_grad._functions == {}  # compiled functions do not travel
    np.testing.assert_allclose(copy.clipped_grad_sum(theta, 1.0).value, expected, rtol=1e-12)


def _gaussian_mean_model(y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def test_a_step_on_jax_samples_what_the_default_backend_samples():
    # the same noise seed, the same public randomness: the two chains are the same chain
    y = np.random.default_rng(5).normal(0.5, 1.0, 2000)
    draws = {}
    for mode in (None, "JAX"):
        with _gaussian_mean_model(y):
            step = pymc_dp.DPPenalty(
                budget=pymc_dp.PrivacyBudget(epsilon=4.0, delta=1e-6),
                noise_rng=11,
                secure_noise=False,
                compile_kwargs={"mode": mode},
            )
        assert step.compile_backend == mode
        idata = pymc_dp.sample(step, chains=1, cores=1, random_seed=2, progressbar=False)
        draws[mode] = np.asarray(idata.posterior["mu"]).ravel()
    np.testing.assert_allclose(draws["JAX"], draws[None], rtol=1e-9)
    assert abs(draws["JAX"].mean() - y.mean()) < 0.1  # and it is the posterior of μ


@pytest.mark.parametrize(
    ("compile_kwargs", "message"),
    [
        ({"mode": "NUMBA"}, "'NUMBA'.* is not supported.*default mode"),
        ({"mode": "JAX", "profile": True}, "accepts only 'mode'"),
        ("JAX", "must be a dict"),
    ],
)
def test_unsupported_compile_kwargs_are_refused_by_name(compile_kwargs, message):
    with _gaussian_mean_model(np.zeros(20)):
        with pytest.raises(InvalidParameterError, match=message):
            pymc_dp.DPPenalty(
                budget=pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-6),
                compile_kwargs=compile_kwargs,
            )


def test_jax_missing_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a)
    )
    with pytest.raises(InvalidParameterError, match="pip install"):
        _compile.check_backend("JAX")


@pytest.mark.parametrize("device", ["cpu", "accelerator"])
def test_a_forked_worker_is_told_how_to_start_workers_instead_of_hanging(device, monkeypatch):
    # "accelerator": the rows' device copy, made in the parent, is not touched in the child
    monkeypatch.setattr(oracle_module, "_device_for", lambda backend: backend and device)
    model = _gaussian_mean_model(np.random.default_rng(0).normal(size=40))
    oracle = RowLikelihood(model, backend="JAX")
    theta = np.array([0.2])
    oracle.loglik_rows(theta)
    assert (oracle._resident is not None) == (device == "accelerator")
    if device == "accelerator":  # a child that would copy the rows again (none made yet)
        oracle._resident = None
    copied = []
    monkeypatch.setattr(oracle_module, "_on_device", lambda a: copied.append(a) or a)
    # as in a process forked after JAX started: the recorded process is another one
    monkeypatch.setattr(_compile, "_jax_process", os.getpid() + 1)
    with pytest.raises(InvalidParameterError, match="mp_ctx='forkserver'"):
        oracle.loglik_rows(theta + 0.1)
    assert copied == []  # refused before any JAX call on the rows


def test_sample_starts_workers_by_forkserver_for_a_jax_step(monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def fake_sample(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(pm, "sample", fake_sample)
    for mode, expected in ((None, None), ("JAX", "forkserver")):
        seen.clear()
        with _gaussian_mean_model(np.random.default_rng(0).normal(size=200)):
            step = pymc_dp.DPPenalty(
                budget=pymc_dp.PrivacyBudget(epsilon=1.0, delta=1e-4),
                noise_multiplier=40.0,
                llr_clip=1.0,
                proposal_scale=0.1,
                init_share=0,
                compile_kwargs={"mode": mode},
            )
            with pytest.raises(Stop):
                pymc_dp.sample(step, chains=2, cores=2, progressbar=False, initvals={"mu": 0.0})
        assert seen.get("mp_ctx") == expected
