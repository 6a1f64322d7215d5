"""The kernel: what every other part of fedsim builds on.

Scenario configuration (:mod:`~fedsim.core.config`), the registry pattern,
the wire protocol and seed streams, the model zoo, data and partitioning,
local training, the GAN of FedCG, ground truth and the scoring metrics. Nothing
here imports a strategy, a client routine, an attack or the engine: the
arrows run one way, ``core <- clients / strategies / attacks <- engine <- cli``.
"""
