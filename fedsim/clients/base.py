"""What a simulated client holds, and the routine interface it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedsim.clients.private_state import KeptOptimizers
from fedsim.core import protocol
from fedsim.core.canaries import CanaryPlan, included_canaries
from fedsim.core.components import Resolved
from fedsim.core.config import DataConfig, ModelConfig
from fedsim.core.data import DatasetBundle
from fedsim.core.devices import gpu_if
from fedsim.core.memorisation import MemorisationConfig
from fedsim.core.modality import input_spec
from fedsim.core.models import InputSpec, SplitNet, build_loaded_model
from fedsim.core.partition import ClientSplit, client_data
from fedsim.core.seeds import SeedStream, derive_seed, model_init_seed
from fedsim.core.training import (
    LossFn,
    client_config_from_record,
    cross_entropy_loss,
    evaluate,
    make_optimizer,
    train_local,
)
from fedsim.text.canaries import planted_windows


@dataclass(frozen=True)
class ClientSpec:
    """What a client reads of its scenario, resolved once (validation builds it).

    The model it trains, the data it holds a part of (``num_clients`` parts,
    split with ``seed``), the federation's ``seed`` its own seeds derive from,
    whether it trains on a GPU, its ``[[defences]]`` in order, and the data's
    partitioner, or generator for a generated dataset: each resolved, its
    class with its frozen ``Params`` (``None``: resolved from ``data`` where
    used), the audit's canaries (:mod:`fedsim.core.canaries`: client
    ``canaries.client`` trains on its share of them; a text client its ``memorisation``
    canary), and whether Flower's
    ``fixedclipping_mod`` clips its replies (``[central-dp] clipping = "client"``).
    How it trains (optimiser, learning rate, epochs, batch size) comes with each
    round's config, as Flower sends it.
    """

    model: ModelConfig
    data: DataConfig
    num_clients: int
    seed: int
    use_gpu: bool = False
    defences: tuple[Resolved, ...] = ()
    partitioner: Resolved | None = None
    generator: Resolved | None = None
    canaries: CanaryPlan = field(default_factory=CanaryPlan)
    central_clipping: bool = False
    memorisation: MemorisationConfig = field(default_factory=MemorisationConfig)


@dataclass
class ClientEnv:
    """One client's world: its data indices, device and private state.

    ``state`` is Flower's per-node ``context.state``; it never leaves the
    client (routines that keep private parameters store them there).
    ``state_dir`` is this run's folder for client-private files (private
    models a resumed run must find); the server never reads it.
    ``canaries``: the audit's canaries this client trains on besides its own
    partition (images, labels; ``None`` for every client but the canary client).
    """

    partition_id: int
    spec: ClientSpec
    bundle: DatasetBundle
    split: ClientSplit
    device: torch.device
    state: RecordDict
    state_dir: Path | None = None
    canaries: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def create(
        cls,
        spec: ClientSpec,
        partition_id: int,
        state: RecordDict,
        state_dir: Path | None = None,
    ) -> ClientEnv:
        bundle, split = client_data(
            spec.data, spec.num_clients, spec.seed, partition_id, spec.partitioner, spec.generator
        )
        canaries = included_canaries(bundle, spec.canaries, partition_id)
        if spec.memorisation.enabled:  # [memorisation]'s text canaries, repeated
            canaries = planted_windows(bundle, spec.memorisation, partition_id)
        device = gpu_if(spec.use_gpu)
        return cls(partition_id, spec, bundle, split, device, state, state_dir, canaries)

    @property
    def train_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Its partition's training examples, then its canaries (if any)."""
        idx = torch.from_numpy(self.split.train)
        images, labels = self.bundle.train_images[idx], self.bundle.train_labels[idx]
        if self.canaries is None:
            return images, labels
        return torch.cat([images, self.canaries[0]]), torch.cat([labels, self.canaries[1]])

    @property
    def train_size(self) -> int:
        """How many examples :attr:`train_data` holds."""
        extra = 0 if self.canaries is None else len(self.canaries[1])
        return len(self.split.train) + extra

    @property
    def test_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The local test split (from the training or the test tensors, as the split says)."""
        return self._held_out(self.split.test)

    @property
    def val_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The local validation split (empty unless ``data.local-eval-source = "test"``)."""
        return self._held_out(self.split.val)

    def _held_out(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(indices)
        if self.split.from_test_set:
            return self.bundle.test_images[idx], self.bundle.test_labels[idx]
        return self.bundle.train_images[idx], self.bundle.train_labels[idx]

    @property
    def input_spec(self) -> InputSpec:
        return input_spec(self.bundle)

    def model(self, arrays: ArrayRecord | None = None) -> SplitNet:
        """A zoo model on this client's device, loaded with ``arrays`` (may be partial)."""
        state = None if arrays is None else arrays.to_torch_state_dict()
        seed = model_init_seed(self.spec.seed)
        return build_loaded_model(self.spec.model, self.input_spec, seed, state, self.device)

    def seed(self, server_round: int) -> int:
        """This client's training seed in ``server_round`` (batch order, dropout, ...)."""
        return derive_seed(SeedStream.CLIENT_TRAIN, self.spec.seed, server_round, self.partition_id)

    def private_seed(self) -> int:
        """Seed of this client's private parameters' initialisation: differs between clients."""
        return derive_seed(SeedStream.PRIVATE_INIT, self.spec.seed, self.partition_id)


class ClientRoutine:
    """Local work for one strategy; override :meth:`train` (and :meth:`evaluate`)."""

    def train(
        self, env: ClientEnv, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord, dict[str, Any]]:
        """Default local training: the global model, the objective :meth:`loss`."""
        model = self.build(env, arrays)
        images, labels = env.train_data
        cfg = client_config_from_record(config)
        server_round = protocol.read_int(config, protocol.SERVER_ROUND)
        optimizers = KeptOptimizers(env, cfg)
        stats = train_local(
            model,
            images,
            labels,
            cfg,
            env.seed(server_round),
            loss_fn=self.loss(model, config),
            optimizer=optimizers.make("task", make_optimizer(model.parameters(), cfg)),
        )
        optimizers.save(server_round)
        reply = self.reply_arrays(env, model, server_round)
        metrics = {protocol.TRAIN_LOSS: stats.mean_loss, protocol.NUM_EXAMPLES: stats.examples}
        return reply, metrics | self.evaluate_trained(env, model)

    def evaluate_trained(self, env: ClientEnv, model: SplitNet) -> dict[str, float]:
        """The FedCG code's evaluation: ``model`` as local training left it, before any
        aggregation, on the local validation (when there is one) and test splits."""
        metrics = {}
        for key, (images, labels) in (
            (protocol.LOCAL_VAL_ACC, env.val_data),
            (protocol.LOCAL_TEST_ACC, env.test_data),
        ):
            if len(labels):
                metrics[key] = evaluate(model, images, labels)[1]
        return metrics

    def build(self, env: ClientEnv, arrays: ArrayRecord) -> SplitNet:
        """The network to train or evaluate, loaded with the received ``arrays``."""
        return env.model(arrays)

    def reply_arrays(self, env: ClientEnv, model: SplitNet, server_round: int) -> ArrayRecord:
        """What a train reply carries: here the whole model.

        Routines with private parameters keep those here (see
        :mod:`fedsim.clients.private_state`) and return only the shared ones.
        """
        return ArrayRecord(model.state_dict())

    def loss(self, model: SplitNet, config: ConfigRecord) -> LossFn:
        """The local objective; subclasses add terms (e.g. FedProx's proximal term)."""
        return cross_entropy_loss

    def evaluate(self, env: ClientEnv, arrays: ArrayRecord, config: ConfigRecord) -> dict[str, Any]:
        """Accuracy of the received model on the client's local test split."""
        model = self.build(env, arrays)
        images, labels = env.test_data
        loss, acc = evaluate(model, images, labels)
        return {
            protocol.EVAL_LOSS: loss,
            protocol.EVAL_ACC: acc,
            protocol.NUM_EXAMPLES: len(labels),
        }
