"""FedSplit's client (the FedCG paper's baseline, Gu et al. 2021).

The client trains its whole network, uploads only ``classifier.*`` and keeps
its extractor private across rounds (:mod:`fedsim.clients.private_state`). Before its
first round a client's extractor is its own seeded initialisation, so
extractors differ between clients from the start. Evaluation is personalised:
the client's own extractor with the received shared classifier, on its local
test split.
"""

from __future__ import annotations

from typing import ClassVar

from flwr.app import ArrayRecord

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv, ClientRoutine
from fedsim.clients.private_state import load_private, save_private
from fedsim.core import protocol
from fedsim.core.models import SplitNet, build_model


@CLIENT_ROUTINES.register("fedsplit")
class FedSplitClient(ClientRoutine):
    """Uploads the parameters named by :attr:`shared_prefixes`; keeps the rest."""

    shared_prefixes: ClassVar[tuple[str, ...]] = protocol.FEDSPLIT_SHARED

    def network(self, env: ClientEnv) -> SplitNet:
        """A fresh network, initialised with this client's private seed."""
        return build_model(env.spec.model, env.input_spec, seed=env.private_seed())

    def build(self, env: ClientEnv, arrays: ArrayRecord) -> SplitNet:
        model = self.network(env)
        private = load_private(env)
        if private is not None:
            model.load_state_dict(private, strict=False)
        model.load_state_dict(arrays.to_torch_state_dict(), strict=False)
        return model.to(env.device)

    def reply_arrays(self, env: ClientEnv, model: SplitNet, server_round: int) -> ArrayRecord:
        state = model.state_dict()
        save_private(env, protocol.drop_prefixed(state, self.shared_prefixes), server_round)
        return ArrayRecord(protocol.keep_prefixed(state, self.shared_prefixes))
