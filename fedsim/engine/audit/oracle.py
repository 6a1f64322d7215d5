"""Ground truth for scoring, out of band: never an input of an attack.

The simulation knows every client's data and seeds, so it can say which
images a client trained on in a round (replaying the client's seeded batch
schedule, :func:`fedsim.core.training.batch_indices`) and compute the probe
gradient a client would send (the gradient of one batch at the model it
received, with the client's own private parameters where it has them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from flwr.app import ArrayRecord, RecordDict

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv
from fedsim.clients.defences import protect_probe
from fedsim.core.config import ClientConfig, Scenario
from fedsim.core.training import batch_indices
from fedsim.engine.audit.observe import images_in_update


@dataclass(frozen=True)
class GroundTruth:
    """The true batch, in pixel space [0, 1], with its labels."""

    images: torch.Tensor
    labels: torch.Tensor


class GroundTruthOracle:
    """Answers "what did client ``p`` train on in round ``r``?" for the scorer."""

    def __init__(self, scenario: Scenario, routine_name: str, state_dir: Path | None) -> None:
        self.scenario = scenario
        self.routine = CLIENT_ROUTINES.get(routine_name)()
        self.state_dir = state_dir

    def _env(self, partition: int) -> ClientEnv:
        # A fresh node state: private parameters come from the run directory.
        return ClientEnv.create(self.scenario, partition, RecordDict(), self.state_dir)

    def _used_indices(self, env: ClientEnv, server_round: int, cfg: ClientConfig) -> torch.Tensor:
        generator = torch.Generator().manual_seed(env.seed(server_round))
        count = images_in_update(len(env.split.train), cfg)
        seen: dict[int, None] = {}
        for batch in batch_indices(len(env.split.train), cfg, generator):
            seen.update(dict.fromkeys(batch.tolist()))
            if len(seen) >= count:
                break
        return torch.tensor(list(seen)[:count], dtype=torch.long)

    def _truth(self, env: ClientEnv, local: torch.Tensor) -> GroundTruth:
        images, labels = env.train_data
        pixels = env.bundle.normalization.to_pixels(images[local]).clamp(0, 1)
        return GroundTruth(pixels, labels[local])

    def update_batch(self, partition: int, server_round: int, cfg: ClientConfig) -> GroundTruth:
        """The examples client ``partition`` trained on in ``server_round``."""
        env = self._env(partition)
        return self._truth(env, self._used_indices(env, server_round, cfg))

    def probe(
        self,
        partition: int,
        server_round: int,
        cfg: ClientConfig,
        sent: ArrayRecord,
        batch_size: int,
    ) -> tuple[dict[str, torch.Tensor], GroundTruth]:
        """One batch's gradient at the model the client received, and that batch."""
        env = self._env(partition)
        local = self._used_indices(env, server_round, cfg)[:batch_size]
        images, labels = env.train_data
        model = self.routine.build(env, sent).cpu()
        model.eval()
        shared = set(sent.keys())
        named = [(n, p) for n, p in model.named_parameters() if n in shared]
        loss = torch.nn.functional.cross_entropy(model(images[local]), labels[local])
        # FedCG's shared generator takes no part in the classification loss: no gradient.
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        gradient = {n: g.detach() for (n, _), g in zip(named, grads, strict=True) if g is not None}
        # What the client shares is its gradient after its own defences.
        gradient = protect_probe(self.scenario, gradient, len(local), server_round, partition)
        return gradient, self._truth(env, local)
