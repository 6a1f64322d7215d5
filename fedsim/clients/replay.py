"""Ground truth by replaying a client: what it trained on, what it would share if probed.

Client-side knowledge, kept with the clients: the simulation knows every
client's data and seeds, so :class:`ClientReplay` can say which images a
client trained on in a round (replaying its seeded batch schedule,
:func:`fedsim.core.training.batch_indices`) and compute the probe gradient it
would share (with its own private parameters and defences). The harness
(:mod:`fedsim.simulation.runner`) hands it to the audit as a
:class:`~fedsim.core.truth.TruthSource`; it meets a reconstruction only in the
scorer, never in an attack.
"""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import ArrayRecord, RecordDict

from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.base import ClientEnv, ClientSpec
from fedsim.clients.defences import ProbeContext, protect_probe
from fedsim.core.config import ClientConfig
from fedsim.core.modality import modality
from fedsim.core.training import batch_indices, examples_touched
from fedsim.core.truth import GroundTruth, probe_gradient


class ClientReplay:
    """A :class:`~fedsim.core.truth.TruthSource` that replays the clients of ``spec``."""

    def __init__(self, spec: ClientSpec, routine_name: str, state_dir: Path | None) -> None:
        self.spec = spec
        self.routine = CLIENT_ROUTINES.get(routine_name)()
        self.state_dir = state_dir

    def _env(self, partition: int) -> ClientEnv:
        # A fresh node state: private parameters come from the run directory.
        return ClientEnv.create(self.spec, partition, RecordDict(), self.state_dir)

    def _used_indices(self, env: ClientEnv, server_round: int, cfg: ClientConfig) -> torch.Tensor:
        generator = torch.Generator().manual_seed(env.seed(server_round))
        count = examples_touched(env.train_size, cfg)
        seen: dict[int, None] = {}
        for batch in batch_indices(env.train_size, cfg, generator):
            seen.update(dict.fromkeys(batch.tolist()))
            if len(seen) >= count:
                break
        return torch.tensor(list(seen)[:count], dtype=torch.long)

    def _truth(self, env: ClientEnv, local: torch.Tensor) -> GroundTruth:
        images, labels = env.train_data
        inputs = modality(env.bundle.modality).truth(env.bundle, images[local])
        return GroundTruth(inputs, labels[local])

    def update_batch(self, partition: int, server_round: int, config: ClientConfig) -> GroundTruth:
        """The examples client ``partition`` trained on in ``server_round``."""
        env = self._env(partition)
        return self._truth(env, self._used_indices(env, server_round, config))

    def probe(
        self,
        partition: int,
        server_round: int,
        config: ClientConfig,
        sent: ArrayRecord,
        batch_size: int,
    ) -> tuple[dict[str, torch.Tensor], GroundTruth]:
        """One batch's gradient at the model the client received, and that batch."""
        env = self._env(partition)
        local = self._used_indices(env, server_round, config)[:batch_size]
        images, labels = env.train_data
        model = self.routine.build(env, sent).cpu()
        gradient = probe_gradient(model, images[local], labels[local], sent.keys())
        # What the client shares is its gradient after its own defences.
        context = ProbeContext(model, images[local])
        gradient = protect_probe(self.spec, gradient, len(local), server_round, partition, context)
        return gradient, self._truth(env, local)

    def layer_inputs(
        self,
        partition: int,
        server_round: int,
        config: ClientConfig,
        sent: ArrayRecord,
        layer: str,
        probed: int | None = None,
    ) -> torch.Tensor:
        """The input of module ``layer`` of the client's own model (private extractor from
        its state) for each example of :meth:`update_batch` (its first ``probed``: the
        batch :meth:`probe` takes), one flattened row each."""
        env = self._env(partition)
        local = self._used_indices(env, server_round, config)[:probed]
        images, _ = env.train_data
        model = self.routine.build(env, sent).cpu().eval()
        captured: list[torch.Tensor] = []
        module = dict(model.named_modules())[layer]
        hook = module.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
        try:
            with torch.no_grad():
                model(images[local])
        finally:
            hook.remove()
        return captured[0].detach().flatten(1)
