"""The training runtime: the tiny model and its MoE layers, stage programs (nodes), pair handlers and issue
orders, the p2p transports, the lowered-list executor, the gradient collective and one job's training loop.
Nothing here imports :mod:`tessera_lab.runner.testbed`."""
