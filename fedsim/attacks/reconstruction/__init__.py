"""The reconstruction attacks: one module each, each registered by name in
:data:`~fedsim.attacks.registry.ATTACKS`, which imports this package's modules on its
first lookup.

A module here imports the contracts (:mod:`fedsim.attacks.base`,
:mod:`fedsim.attacks.registry`, :mod:`fedsim.attacks.presets`) and the shared
machinery (:mod:`fedsim.attacks.toolkits`), never another attack or leak analysis
(``tests/test_layers.py``): a variant extends a toolkit's base, as ``dlg``,
``unrolled-dlg`` and ``aligned-dlg`` all extend
:class:`~fedsim.attacks.toolkits.dlg_matching.DLGMatching`.
"""
