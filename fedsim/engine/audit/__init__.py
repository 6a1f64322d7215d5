"""The honest-but-curious server's per-round privacy audit.

- :mod:`fedsim.engine.audit.wrapper`: :class:`AuditedStrategy` wraps any Flower
  strategy, leaves its aggregate untouched and hands what the server received
  to the auditor.
- :mod:`fedsim.engine.audit.observe`: builds an :class:`~fedsim.attacks.base.Observation`
  from exactly what the server sent and received.
- :mod:`fedsim.engine.audit.oracle`: ground truth, out of band (the simulation knows
  each client's data); it reaches only the scorer.
- :mod:`fedsim.engine.audit.auditor`: runs attacks as Ray tasks, scores them with
  :mod:`fedsim.core.metrics` and writes ``audit.csv`` and PNG grids as results arrive.
"""
