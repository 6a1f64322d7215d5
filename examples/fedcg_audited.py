"""A Flower user's own app: fedsim's FedCG and privacy audit inside a plain ServerApp.

Nothing here goes through fedsim's scenario runner. The ServerApp builds the
strategy as Flower's are built (``FedCG(distill_iterations=...)``), wraps it
in :class:`~fedsim.audit.wrapper.AuditedStrategy` and runs Flower's
own ``Strategy.start()``; sampling is Flower's. The ClientApp answers FedCG's
message contract (:mod:`fedsim.strategies.fedcg`) with fedsim's FedCG client
routine on one partition of the embedded MNIST digits. The audit has no truth
source here (the server cannot know the clients' data), so ``audit.csv``
records each reconstruction and its final gradient distance unscored.

Run it (two rounds; 400 s under the test on two heavily shared cores)::

    python examples/fedcg_audited.py runs/example-fedcg
"""

from __future__ import annotations

import sys
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation
from rich.console import Console

from fedsim.attacks import ATTACKS
from fedsim.audit import AuditedStrategy, Auditor, ServerView
from fedsim.clients.app import build_client_app
from fedsim.core import protocol
from fedsim.core.components import resolve
from fedsim.core.config import AuditConfig, ComponentConfig
from fedsim.core.data import load_dataset
from fedsim.core.gan import GanSplitNet, build_gan_split_net
from fedsim.core.models import InputSpec
from fedsim.core.scenario_file import scenario_from_dict
from fedsim.core.seeds import model_init_seed
from fedsim.core.training import client_config_record
from fedsim.scenario.components import client_spec
from fedsim.strategies import FedCG

CLIENTS = 2
SEED = 0
# What the clients run on (their data and local training); the server reads
# only the model and the public train settings from it.
CLIENT_SIDE = scenario_from_dict(
    {
        "name": "example-fedcg",
        "federation": {"num-clients": CLIENTS, "seed": SEED},
        "data": {"dataset": "mnist-embedded", "samples-per-client": 40},
        "model": {"name": "lenet-zhu", "init": "uniform"},
        "client": {"local-steps": 1, "batch-size": 1, "optimizer": "sgd", "lr": 0.01},
    }
)


def server_app(run_dir: Path, rounds: int, distill_iterations: int) -> ServerApp:
    """The user's ServerApp: FedCG, audited with DLG, under Flower's ``start``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        bundle = load_dataset(CLIENT_SIDE.data)
        spec = InputSpec(bundle.channels, bundle.image_size, bundle.num_classes)
        seed = model_init_seed(SEED)

        def network() -> GanSplitNet:
            return build_gan_split_net(CLIENT_SIDE.model, spec, seed)

        strategy = FedCG(
            distill_iterations=distill_iterations,
            network=network,
            seed=SEED,
            min_train_nodes=CLIENTS,
            min_available_nodes=CLIENTS,
        )
        dlg = resolve(ATTACKS, ComponentConfig("dlg", {"steps": 5, "restarts": 1}), "attack")
        view = ServerView(CLIENT_SIDE.model, spec, bundle.normalization, "fedcg")
        auditor = Auditor(AuditConfig(enabled=True), [dlg], view, None, run_dir, Console())
        shared = protocol.keep_prefixed(network().state_dict(), FedCG.shared_prefixes)
        AuditedStrategy(strategy, auditor).start(
            grid,
            ArrayRecord(shared),
            num_rounds=rounds,
            train_config=ConfigRecord(client_config_record(CLIENT_SIDE.client)),
        )

    return app


def client_app() -> ClientApp:
    """The ClientApp: FedCG's client routine on this node's partition."""
    return build_client_app(client_spec(CLIENT_SIDE), "fedcg")


def run(run_dir: Path, rounds: int = 2, distill_iterations: int = 20) -> None:
    """Simulate the app with Flower's Ray engine, leaving the audit a CPU.

    Flower starts one client actor per ``client_resources`` share of Ray's CPUs
    and keeps them: 3 CPUs at 2 per actor give one actor and one free CPU, on
    which the attack tasks (1 CPU each) run. Without a free CPU a sync audit
    would wait for ever.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    run_simulation(
        server_app=server_app(run_dir, rounds, distill_iterations),
        client_app=client_app(),
        num_supernodes=CLIENTS,
        backend_config={
            "client_resources": {"num_cpus": 2, "num_gpus": 0},
            "init_args": {"num_cpus": 3, "num_gpus": 0},
        },
    )


if __name__ == "__main__":
    run(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/example-fedcg"))
