"""The leak analyses besides reconstruction (labels, membership, class representatives,
words): one module each, registered by name in :data:`~fedsim.attacks.leakage.LEAKS`,
which imports this package's modules on its first lookup.

A module here imports the contracts (:mod:`fedsim.attacks.base`,
:mod:`fedsim.attacks.leakage`) and the shared machinery (:mod:`fedsim.attacks.toolkits`),
never another analysis or attack (``tests/test_layers.py``).
"""
