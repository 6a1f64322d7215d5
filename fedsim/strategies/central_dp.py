"""Flower's central differential privacy around any plain-mean strategy (``[central-dp]``).

Flower 1.42's wrappers (``DifferentialPrivacyServerSideFixedClipping``,
``DifferentialPrivacyClientSideFixedClipping``) clip each client's update to a norm
``C``, pass the replies to the wrapped strategy, and add Gaussian noise of standard
deviation ``z * C / n`` to its aggregate of the ``n`` sampled clients (McMahan et al.
2018, user-level DP-FedAvg). Flower's own accounted mode accepts only Flower's
``FedAvg.aggregate_train``; fedsim's strategies that qualify (``plain_mean``: the new
global model is the mean of the uploads) differ from it only in what fedsim refuses
under central DP (stragglers), so the wrapper here hands Flower's accounting machinery
Flower's ``RdpAccountant`` after construction. Flower then checks every round's sample
size and equal client weights, skips a round with a failed reply (nothing is released,
nothing composed), and composes one Gaussian event per release; the epsilon spent so
far is the round's ``central-dp-epsilon`` metric.

Two departures from Flower, both about randomness and resumption: the noise is drawn
from the federation's named stream for the round (Flower draws from NumPy's global
generator), and a checkpoint keeps the number of releases, which a resumed run composes
again.

What it protects: the released global model (what clients and anyone given the model
see). Flower's server draws the noise after aggregating, so a curious server sees each
reply (the ``update`` threat model), or behind secure aggregation their sum (the
``aggregate`` one), before any noise; client-side clipping is what changes its view.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord
from flwr.serverapp import GaussianPrivacyEvent, PrivacyConfig, RdpAccountant
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase
from flwr.supercore.differential_privacy import compute_stdv
from flwr.supercore.privacy_accounting import NeighboringRelation, SamplingMethod

from fedsim.core import protocol
from fedsim.core.config import CentralDPConfig
from fedsim.core.seeds import SeedStream, stream_rng
from fedsim.strategies.base import FedsimStrategy

RELEASES = "central-dp-releases"
"""Checkpoint key: how many noised aggregates the accountant has composed."""


class _CentralDP(DifferentialPrivacyFixedClippingBase, FedsimStrategy):
    """fedsim's engine hooks, accounting and seeded noise on Flower's fixed-clipping wrappers."""

    def __init__(
        self,
        inner: FedsimStrategy,
        config: CentralDPConfig,
        sampled: int,
        population: int,
        seed: int,
    ) -> None:
        super().__init__(inner, config.noise_multiplier, config.clipping_norm, sampled)
        self.inner = inner
        privacy = PrivacyConfig(
            target_delta=config.delta,
            population_size=population,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod.NO_AMPLIFICATION,
        )
        # After Flower's constructor, which accepts an accountant only around its own FedAvg.
        self.accountant = RdpAccountant(privacy)
        self.seed = seed
        self._round = 0

    def _event(self) -> GaussianPrivacyEvent:
        assert self.accountant is not None
        population = self.accountant.config.population_size
        return GaussianPrivacyEvent(self.noise_multiplier, self.num_sampled_clients, population)

    def epsilon(self) -> float:
        """User-level epsilon spent so far, at the configured delta."""
        assert self.accountant is not None
        return float(self.accountant.get_privacy_spent().epsilon)

    # -- engine hooks ------------------------------------------------------------

    def initial_arrays(self) -> ArrayRecord:
        return self.inner.initial_arrays()

    def state_for_checkpoint(self) -> dict[str, Any]:
        assert self.accountant is not None
        return {**self.inner.state_for_checkpoint(), RELEASES: self.accountant.num_releases}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        releases = int(state.pop(RELEASES, 0))
        assert self.accountant is not None
        if releases:  # every release is the same event: sample size and noise are fixed
            self.accountant.compose(self._event(), count=releases)
        self.inner.restore_checkpoint_state(state)

    # -- Flower's Strategy ---------------------------------------------------------

    def aggregate_train(
        self, server_round: int, replies: Any
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self._round = server_round
        # The concrete Flower wrapper after this class in the MRO aggregates.
        arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[safe-super]
        if arrays is None:
            return arrays, metrics
        metrics = metrics if metrics is not None else MetricRecord()
        metrics[protocol.CENTRAL_DP_EPSILON] = self.epsilon()
        return arrays, metrics

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays: ArrayRecord) -> ArrayRecord:
        """Flower's noise (same standard deviation), drawn from the round's named stream."""
        stdv = compute_stdv(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
        rng = stream_rng(SeedStream.CENTRAL_DP_NOISE, self.seed, self._round)
        noised = {}
        for name, array in aggregated_arrays.items():
            values = array.numpy()
            noise = rng.normal(0.0, stdv, values.shape).astype(values.dtype)
            noised[name] = Array(np.asarray(values + noise))
        return ArrayRecord(noised)


class ServerSideClipping(_CentralDP, DifferentialPrivacyServerSideFixedClipping):
    """Flower's ``DifferentialPrivacyServerSideFixedClipping`` with fedsim's hooks."""


class ClientSideClipping(_CentralDP, DifferentialPrivacyClientSideFixedClipping):
    """Flower's ``DifferentialPrivacyClientSideFixedClipping`` with fedsim's hooks; the clients
    clip with Flower's ``fixedclipping_mod`` (:func:`fedsim.clients.app.build_client_app`)."""


WRAPPERS: dict[str, type[_CentralDP]] = {
    "server": ServerSideClipping,
    "client": ClientSideClipping,
}


def with_central_dp(
    strategy: FedsimStrategy, config: CentralDPConfig, sampled: int, population: int, seed: int
) -> FedsimStrategy:
    """``strategy`` wrapped in the Flower wrapper ``config.clipping`` names (``sampled``
    clients a round of ``population``; noise seeded from the federation's ``seed``)."""
    return WRAPPERS[config.clipping](strategy, config, sampled, population, seed)
