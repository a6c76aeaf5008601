"""Launching runs: the local spawner, the supervised workers, results and the ``run`` command line."""
