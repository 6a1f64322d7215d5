"""The engine: runs scenarios on Flower and audits them.

It assembles the components (:mod:`fedsim.strategies`, :mod:`fedsim.clients`,
:mod:`fedsim.attacks`) over the kernel (:mod:`fedsim.core`): validation of what a
scenario names, the Flower boundary, the round loop, the runner, checkpoints,
run directories, the privacy audit and sweeps. Only the CLI imports it.
"""
