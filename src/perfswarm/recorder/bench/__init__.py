"""Everything that runs work on this machine to measure it: kernel sweeps (kernels.py),
collective sweeps (collectives.py), embedding-bag timings (embedding.py). The fitted models
they feed live in model/, which runs nothing."""
