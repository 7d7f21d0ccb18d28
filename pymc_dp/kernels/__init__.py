"""One iteration of each DP MCMC algorithm, as plain functions (no PyMC in here)."""
