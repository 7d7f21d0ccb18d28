"""``python -m pymc_dp.experiments``: the reproduction runner (:mod:`.reproduce`)."""

from pymc_dp.experiments.reproduce import main

if __name__ == "__main__":
    main()
