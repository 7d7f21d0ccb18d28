"""DPHMC at large n: time per iteration against n, and peak memory (logistic regression, d = 10).

For each n (default 10⁵, 10⁶, 10⁷), in a fresh process so that each peak is its own: simulate
the data (float64 covariates: 800 MB at n = 10⁷), build ``pymc_dp.DPHMC`` with explicit settings
(``L = 10`` leapfrog steps; no private initialisation, whose many passes would dominate), run
one warm-up iteration and time the next ones (``step.step``, as ``pm.sample`` calls it). Each
iteration reads the data ``L + 1`` times in chunks, so its time should grow linearly in n and
its memory stay at the data plus a few n-vectors.

Columns: ``build s`` (oracle checks, validation, compilation), ``ms / iter``, ``ns / row /
pass`` (time per iteration / (n · (L + 1))): flat when the cost is linear in n, and ``peak GB``
(the process's high-water resident memory, data included; ``data GB`` is the covariates' own
size); with JAX on an accelerator, ``device GB`` is the accelerator's high-water memory (the
rows are copied there once and stay: the data plus each chunk's intermediates).

The last lines: ``peak memory at n = <n>: <x> GB (target 4)`` and ``per-row cost, largest n /
smallest n: <r> (linear: 1)``. Run: ``python benchmarks/scale.py`` (``--sizes 100000 1000000``
for a quicker look; ``--modes default JAX`` compares the default backend with JAX, each in its
own processes, and prints JAX's speed-up per n).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

L = 10
PEAK_TARGET_GB = 4.0

SCRIPT = textwrap.dedent(
    """
    import json, sys, time, warnings
    warnings.filterwarnings("ignore")
    import numpy as np, pymc as pm
    import pymc_dp

    n, d, L, iterations = int(sys.argv[1]), 10, int(sys.argv[2]), int(sys.argv[3])
    mode = None if sys.argv[4] == "default" else sys.argv[4]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    beta_true = rng.normal(size=d) * 0.3
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(X @ beta_true)))).astype("int64")
    data_gb = X.nbytes / 2**30
    with pm.Model() as model:
        Xd = pm.Data("X", X)
        beta = pm.Normal("beta", 0, 1, shape=d)
        pm.Bernoulli("y", logit_p=Xd @ beta, observed=y)
    del X
    start = time.perf_counter()
    with model:
        step = pymc_dp.DPHMC(
            budget=pymc_dp.PrivacyBudget(epsilon=1e6, delta=1e-6),
            step_size=0.5 / np.sqrt(n), n_steps=L, grad_clip=5.0, llr_clip=2.0,
            grad_noise_multiplier=10.0, llr_noise_multiplier=10.0, step_jitter=False,
            compile_kwargs={"mode": mode},
        )
    build = time.perf_counter() - start
    step.tune = False
    point = {**model.initial_point(), "beta": beta_true}
    point, _ = step.step(point)  # warm-up: the chain's start, first compiled calls
    start = time.perf_counter()
    for _ in range(iterations):
        point, _ = step.step(point)
    per_iteration = (time.perf_counter() - start) / iterations
    with open("/proc/self/status") as status:
        peak_kib = next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
    device_gb = None  # an accelerator's own high-water mark (JAX reports none for its CPU)
    if mode is not None:
        import jax
        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            device_gb = stats["peak_bytes_in_use"] / 2**30
    print(json.dumps({"build": build, "iteration": per_iteration, "peak_gb": peak_kib / 2**20,
                      "data_gb": data_gb, "device_gb": device_gb}))
    """
)


def measure(n: int, iterations: int, mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(n), str(L), str(iterations), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--iterations", type=int, default=5, help="timed iterations per size")
    parser.add_argument(
        "--modes",
        nargs="*",
        default=["default"],
        choices=["default", "JAX"],
        help="backends of the per-row functions (compile_kwargs={'mode': ...}); default: default",
    )
    args = parser.parse_args()
    devices = "-"
    if "JAX" in args.modes:
        import jax

        devices = ", ".join(str(d) for d in jax.devices())
    print(f"logistic regression, d = 10, DPHMC with L = {L} (L + 1 data passes per iteration)")
    print(f"JAX devices: {devices}")
    print(
        f"{'mode':>8s} {'n':>10s} {'build s':>8s} {'ms / iter':>10s} {'ns/row/pass':>12s} "
        f"{'peak GB':>8s} {'data GB':>8s} {'device GB':>9s}"
    )
    results: dict[str, list] = {}
    for mode in args.modes:
        rows = results.setdefault(mode, [])
        for n in args.sizes:
            r = measure(n, args.iterations, mode)
            per_row = 1e9 * r["iteration"] / (n * (L + 1))
            rows.append((n, per_row, r["peak_gb"], r["iteration"]))
            print(
                f"{mode:>8s} {n:>10d} {r['build']:8.1f} {1e3 * r['iteration']:10.1f} "
                f"{per_row:12.2f} {r['peak_gb']:8.2f} {r['data_gb']:8.2f} "
                + ("        -" if r["device_gb"] is None else f"{r['device_gb']:9.2f}"),
                flush=True,
            )
    for mode, rows in results.items():
        n_max, per_row_max, peak, _ = rows[-1]
        print(f"{mode}: peak memory at n = {n_max}: {peak:.2f} GB (target {PEAK_TARGET_GB:g})")
        print(
            f"{mode}: per-row cost, largest n / smallest n: {per_row_max / rows[0][1]:.2f} "
            "(linear: 1)"
        )
    if len(results) > 1 and "default" in results:
        for mode, rows in results.items():
            if mode == "default":
                continue
            speedups = [d[3] / r[3] for d, r in zip(results["default"], rows, strict=True)]
            print(
                f"{mode} speed-up over default, per iteration: "
                + ", ".join(f"n = {r[0]}: {x:.2f}x" for r, x in zip(rows, speedups, strict=True))
            )


if __name__ == "__main__":
    main()
