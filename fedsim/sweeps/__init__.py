"""``fedsim compare``: a privacy-utility sweep from one spec file.

Users weigh accuracy against leakage; FedCG's Table 2 is the model. A spec
names a base scenario and the axes of a sweep, strategies x defences x seeds
(:mod:`fedsim.sweeps.spec`). Each configuration runs as ``fedsim run`` would,
and a rerun skips or continues what it finds (:mod:`fedsim.sweeps.runs`); the
finished runs' scores are summarised over seeds (:mod:`fedsim.sweeps.table`)
and written with a plot and reports (:mod:`fedsim.sweeps.report`).
"""
