"""Iterations allowed vs ε: tight PLD accounting vs zCDP (thesis §6.1, Figure 6.1).

Settings of the 2-d flat banana experiment (thesis Table 5.1, §6.1): n = 100 000 rows,
δ = 0.1/n, the seeds' noise parametrisation σ = τ √n Δ (z = τ √n):

* DP penalty, τ = 0.1                          (μ = 1/(2 τ² n) per iteration)
* DP HMC, τ_l = 0.1, τ_g = 0.55, L = 25        (μ = 1/(2 τ_l² n) + (L+1)/(2 τ_g² n))

Part of the reproduction runner (``python -m pymc_dp.experiments --part accounting``), which
writes ``accounting_iterations.png`` and ``accounting.csv`` and prints the table used in
``docs/accounting.md``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from pymc_dp.accounting import GaussianCost, compose, gaussian_iterations, zcdp_iterations

N = 100_000
DELTA = 0.1 / N

SETTINGS = {
    r"DP penalty ($\tau$ = 0.1)": GaussianCost.from_noise_multiplier(0.1 * math.sqrt(N)),
    r"DP HMC ($\tau_l$ = 0.1, $\tau_g$ = 0.55, $L$ = 25)": compose(
        GaussianCost.from_noise_multiplier(0.1 * math.sqrt(N)),
        (GaussianCost.from_noise_multiplier(0.55 * math.sqrt(N)), 25 + 1),
    ),
}
TABLE_EPS = (0.5, 1.0, 2.0, 4.0, 6.0, 12.0)


def main(out_dir: Path) -> None:
    """Write the figure and the CSV of iterations allowed (tight PLD vs zCDP) to ``out_dir``."""
    from pymc_dp.experiments import pyplot

    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "accounting.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["setting", "epsilon", "delta", "iterations_tight", "iterations_zcdp"])
        for title, cost in SETTINGS.items():
            for e in TABLE_EPS:
                writer.writerow(
                    [
                        title.replace("$", "").replace("\\", ""),
                        e,
                        DELTA,
                        gaussian_iterations(e, DELTA, cost.mu),
                        zcdp_iterations(e, DELTA, cost.mu),
                    ]
                )
    eps_grid = np.geomspace(0.25, 12.0, 200)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True, constrained_layout=True)
    for ax, (title, cost) in zip(axes, SETTINGS.items(), strict=True):
        tight = [gaussian_iterations(e, DELTA, cost.mu) for e in eps_grid]
        zcdp = [zcdp_iterations(e, DELTA, cost.mu) for e in eps_grid]
        ax.step(eps_grid, tight, where="post", color="C0", lw=2, label="tight PLD, ⌊M*/μ⌋")
        ax.step(eps_grid, zcdp, where="post", color="C3", lw=2, ls="--", label="zCDP, ⌊ρ*/μ⌋")
        lines = []
        for e in (12.0, 4.0, 1.0):
            k_t = gaussian_iterations(e, DELTA, cost.mu)
            k_z = zcdp_iterations(e, DELTA, cost.mu)
            lines.append(f"ε={e:>2g}: {k_t:>5d} vs {k_z:>5d}  (×{k_t / k_z:.2f})")
        ax.text(
            0.03,
            0.97,
            "tight vs zCDP\n" + "\n".join(lines),
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=9,
            family="monospace",
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7"},
        )
        ax.plot(
            TABLE_EPS,
            [gaussian_iterations(e, DELTA, cost.mu) for e in TABLE_EPS],
            "o",
            color="C0",
            ms=4,
        )
        ax.plot(
            TABLE_EPS,
            [zcdp_iterations(e, DELTA, cost.mu) for e in TABLE_EPS],
            "s",
            color="C3",
            ms=4,
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([0.25, 0.5, 1, 2, 4, 8, 12])
        ax.set_xticklabels(["0.25", "0.5", "1", "2", "4", "8", "12"])
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("ε  (δ = 0.1/n = 1e-6, n = 100 000)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("iterations allowed (all chains)")
    axes[0].legend(loc="lower right", fontsize=9)
    fig.suptitle("Iterations the budget allows: tight PLD vs zCDP accounting", fontsize=12)
    out = out_dir / "accounting_iterations.png"
    fig.savefig(out, dpi=130)
    plt.close(fig)
    print(f"wrote {out}")

    print("| ε | penalty tight | penalty zCDP | ratio | HMC tight | HMC zCDP | ratio |")
    print("|---|---|---|---|---|---|---|")
    for e in TABLE_EPS:
        row = [f"{e:g}"]
        for cost in SETTINGS.values():
            t, z = gaussian_iterations(e, DELTA, cost.mu), zcdp_iterations(e, DELTA, cost.mu)
            row += [str(t), str(z), f"{t / z:.2f}"]
        print("| " + " | ".join(row) + " |")
