"""The honest-but-curious server's per-round privacy audit.

- :mod:`fedsim.audit.wrapper`: :class:`AuditedStrategy` wraps any Flower
  strategy, leaves its aggregate untouched and hands what the server received
  to the auditor.
- :mod:`fedsim.audit.observe`: builds an :class:`~attacks.base.Observation`
  from exactly what the server sent and received.
- :mod:`fedsim.audit.oracle`: ground truth, out of band (the simulation knows
  each client's data); it reaches only the scorer.
- :mod:`fedsim.audit.auditor`: runs attacks as Ray tasks, scores them with
  :mod:`fedsim.metrics` and writes ``audit.csv`` and PNG grids as results arrive.
"""
