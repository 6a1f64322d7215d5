"""The machinery attacks and leak analyses share; nothing here is registered.

Gradients and the victim's model as the attacker rebuilds it (``gradients``), label
inference from the last layer (``labels``), the client's local training replayed
(``replay``) and the matching problem built on it (``matching_problem``), the
gradient-matching loop (``matching``; its hyper-parameters live in
:mod:`fedsim.core.params.matching`) and DLG's objective on it
(``dlg_matching``), batched optimisers (``optim``), the convergence rule
(``convergence``), closed-form reads and feature inversion (``closed_form``), the
analytic attacks' bases (``analytic``, ``first_layer``), R-GAP's linear systems
(``layer_systems``), FedCG's uploaded generator (``generator``), the output layer's
checks (``output_layer``), the text victim (``text_victim``) and attack precision
(``precision``). A toolkit imports the contracts and other toolkits, never a concrete
attack or analysis (``tests/test_layers.py``).
"""
