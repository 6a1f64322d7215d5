"""The local baseline: nothing travels, every client's whole model is private."""

from __future__ import annotations

import torch
from inprocess import run_inprocess, tiny_table

from fedsim.clients.local import LocalClient
from fedsim.clients.private_state import load_private
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.training import evaluate


def test_local_clients_share_nothing_and_evaluate_their_own_model() -> None:
    run = run_inprocess(scenario_from_dict(tiny_table({"name": "local"})))

    assert run.grid.array_names() == set()
    assert len(run.final_arrays) == 0
    final = run.records[-1]
    assert final.server == {}
    models = {}
    for p in range(3):
        private = load_private(run.env(p))
        assert private is not None
        model = LocalClient().network(run.env(p))
        assert set(private) == set(model.state_dict())
        model.load_state_dict(private)
        models[p] = model
        reported = next(
            r for r in final.clients if r["phase"] == "evaluate" and r["partition-id"] == p
        )
        loss, acc = evaluate(model, *run.env(p).test_data)
        assert (loss, acc) == (reported["eval-loss"], reported["eval-acc"])
    weights = [models[p].state_dict()["classifier.5.weight"] for p in range(3)]
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])
