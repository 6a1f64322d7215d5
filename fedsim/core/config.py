"""The scenario's schema: typed, validated, frozen dataclasses, one per TOML table.

There is one configuration path. A scenario file is read with :mod:`tomllib`,
``--set key=value`` overrides are merged into the raw tables
(:mod:`fedsim.core.scenario_file`), and every table is converted by
:func:`~fedsim.core.toml_tables.parse_table`, which rejects unknown keys and wrong types
and runs each dataclass's own range checks. Component parameters (a strategy's
``mu``, a partitioner's ``alpha``, an attack's ``steps``) go through the same
function, against the frozen ``Params`` dataclass the component registers.

Keys are kebab-case in TOML (``clients-per-round``) and snake_case in Python.

Not pydantic (tried for issue 27): its strict mode refuses TOML's lists for
tuples and tables for dataclasses, its lax mode takes ``"3"``, ``1.0`` and
``true`` for an integer, so strict scalars needed a pass over its core schema;
and today's one-line messages (the allowed keys, "a list of an integer", "a
number or absent", which of several errors comes first) needed a walk of the
type hints along each error's location: 664 lines against 643 for this file by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Interval, doc

from fedsim.core.bounds import Bounded
from fedsim.core.errors import ScenarioError as ScenarioError  # re-exported
from fedsim.core.errors import first_line as first_line  # re-exported
from fedsim.core.errors import require as require  # re-exported
from fedsim.core.memorisation import MemorisationConfig
from fedsim.core.plugins import is_path, require_module_name
from fedsim.core.threat import ThreatModel


def require_seed(seed: int, key: str) -> None:
    """Seeds feed NumPy's ``SeedSequence``, which takes no negative numbers."""
    require(seed >= 0, key, seed, "must be >= 0 (a seed)")


Seed = Annotated[int, Ge(0), doc("a seed")]
"""A seed field (:func:`require_seed`'s rule, declared)."""


MIN_IMAGE_SIZE = 8
"""The smallest side accepted; whether a model fits a size is checked by a dry forward pass."""

MAX_IMAGE_SIZE = 1024
"""Every image is held in memory at ``image-size``; 1024 is 8x the largest dataset side here."""


def require_image_size(size: int, key: str) -> None:
    """An image side within :data:`MIN_IMAGE_SIZE` .. :data:`MAX_IMAGE_SIZE`."""
    require(
        MIN_IMAGE_SIZE <= size <= MAX_IMAGE_SIZE,
        key,
        size,
        f"must be between {MIN_IMAGE_SIZE} and {MAX_IMAGE_SIZE}",
    )


def require_file_name(name: str, key: str) -> None:
    """``name`` becomes a file or folder name: one plain path component, never ``..``."""
    plain = (
        bool(name)
        and name not in (".", "..")
        and not any(c in name for c in "/\\\0")
        and name.isprintable()
    )
    require(
        plain,
        key,
        name,
        "must be a plain file name (no '/', '\\', '..', control characters; not empty)",
    )


@dataclass(frozen=True)
class ComponentConfig:
    """A component named in a scenario: ``name`` plus that component's parameters.

    The parameters are validated later against the component's registered
    ``Params`` dataclass (see :func:`component_params`).
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:  # params is a dict; configs are cache keys
        return hash((self.name, repr(sorted(self.params.items()))))


@dataclass(frozen=True)
class FederationConfig(Bounded):
    """Who takes part and for how long."""

    num_clients: Annotated[int, Ge(1)] = 4
    clients_per_round: int | None = None
    fraction: Annotated[float | None, Interval(gt=0, le=1)] = None
    rounds: Annotated[int, Ge(1)] = 3
    seed: Seed = 0
    evaluate_fraction: Annotated[float | None, Interval(ge=0, le=1)] = None
    evaluate_clients_per_round: int | None = None
    # Systems heterogeneity (FedProx, Li et al. 2020): this share of each round's sampled
    # clients (rounded half up) does fewer local epochs, drawn from the seed and the round.
    stragglers: Annotated[
        float,
        Interval(ge=0, lt=1),
        doc("the share of each round's sampled clients that does fewer epochs"),
    ] = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.clients_per_round is None or self.fraction is None,
            "clients-per-round",
            self.clients_per_round,
            "give either clients-per-round or fraction, not both",
        )
        if self.clients_per_round is not None:
            require(
                1 <= self.clients_per_round <= self.num_clients,
                "clients-per-round",
                self.clients_per_round,
                f"must be between 1 and num-clients ({self.num_clients})",
            )
        require(
            self.evaluate_clients_per_round is None or self.evaluate_fraction is None,
            "evaluate-clients-per-round",
            self.evaluate_clients_per_round,
            "give either evaluate-clients-per-round or evaluate-fraction, not both",
        )
        if self.evaluate_clients_per_round is not None:
            require(
                0 <= self.evaluate_clients_per_round <= self.num_clients,
                "evaluate-clients-per-round",
                self.evaluate_clients_per_round,
                f"must be between 0 and num-clients ({self.num_clients})",
            )

    @property
    def sampled_per_round(self) -> int:
        """Number of clients sampled for training each round."""
        if self.clients_per_round is not None:
            return self.clients_per_round
        if self.fraction is not None:
            return max(1, int(self.fraction * self.num_clients))
        return self.num_clients

    @property
    def evaluated_per_round(self) -> int:
        """Number of clients sampled for local evaluation each round (default: all)."""
        if self.evaluate_clients_per_round is not None:
            return self.evaluate_clients_per_round
        fraction = 1.0 if self.evaluate_fraction is None else self.evaluate_fraction
        return round(fraction * self.num_clients)


@dataclass(frozen=True)
class DataConfig(Bounded):
    """Which data, how it is shaped, and how it is split across clients."""

    dataset: str = "mnist-embedded"
    root: str = ""
    download: bool = False
    image_size: int = 32
    channels: Literal["native", "gray", "rgb"] = "native"
    normalize: bool = False
    # What ``normalize`` standardises with: the training set's per-channel mean and
    # std ("dataset"), or mean 0.5 and std 0.5 (the FedCG code's ``Normalize(0.5, 0.5)``).
    normalization: Literal["dataset", "half"] = "dataset"
    partitioner: ComponentConfig = ComponentConfig("iid")
    # A generated dataset's parameters (``data.generator``, a table); ``name`` repeats
    # ``dataset``. Real datasets take none.
    generator: ComponentConfig = ComponentConfig("")
    samples_per_client: Annotated[int, Ge(0), doc("0 = all the client's samples")] = 0
    test_fraction: Annotated[float, Interval(ge=0, lt=1)] = 0.2
    # Where a client's local evaluation data come from: ``test-fraction`` of its own
    # examples ("train"), or a validation and a test slice of the dataset's held-out
    # test set, each 1 / (2 clients) of it ("test"; the FedCG code's split).
    local_eval_source: Literal["train", "test"] = "train"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_image_size(self.image_size, "image-size")
        require(
            self.local_eval_source == "train" or self.test_fraction == 0,
            "test-fraction",
            self.test_fraction,
            'must be 0 when local-eval-source = "test" (evaluation data come from the test set)',
        )


@dataclass(frozen=True)
class ModelConfig:
    """The architecture (a model zoo name) and its weight initialisation."""

    name: str = "lenet5-grnn"
    init: str = "default"


@dataclass(frozen=True)
class ClientConfig(Bounded):
    """Local training: sent to clients each round, so it is public to the server."""

    local_epochs: Annotated[int, Ge(1)] = 1
    local_steps: Annotated[int, Ge(0), doc("0 = train local-epochs epochs")] = 0
    batch_size: Annotated[int, Ge(1)] = 32
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: Annotated[float, Gt(0)] = 0.05
    momentum: Annotated[float, Interval(ge=0, lt=1)] = 0.0
    weight_decay: Annotated[float, Ge(0)] = 0.0
    # "fresh": a new optimiser every round; "kept": each client's optimiser state
    # (Adam's moments and step) carries over to its next round, privately.
    optimizer_state: Literal["fresh", "kept"] = "fresh"
    # "hflip": each training example is mirrored left-right with probability 1/2.
    augment: Literal["none", "hflip"] = "none"


@dataclass(frozen=True)
class BackendConfig(Bounded):
    """Ray resources per simulated client, and where Ray runs."""

    # Ray counts resources in steps of 1e-4: a smaller request is zero to Ray.
    num_cpus: Annotated[float, Ge(0.0001)] = 1.0
    num_gpus: Annotated[float, Ge(0)] = 0.0
    address: str = ""
    ray_cpus: Annotated[int, Ge(0), doc("0 = all cores of this machine")] = 0
    # How long to wait for Ray resources (the audit's reservation).
    wait_timeout: Annotated[float, Gt(0), doc("seconds")] = 120.0


AUTO: Literal["auto"] = "auto"
"""``audit.attacks = "auto"``: the attack portfolio that applies to the scenario."""


RECONSTRUCTION_REACH = 5
"""The largest client (in images) from whose update an optimisation attack recovered an image
at 20 dB: 3 of 10 Fashion-MNIST images at 5 per client; none at 10 (bench/fedavg_leakage.py,
docs/attacks.md#reach-on-real-multi-step-updates); ``audit.max-images``' default. A
closed-form attack reaches as far as its own ``max_batch`` (``adam-signs``: Adam clients of
up to 512 images, measured there too)."""


@dataclass(frozen=True)
class AuditConfig(Bounded):
    """The honest-but-curious server's per-round privacy audit (off by default).

    ``attacks`` are tables ``{name = "dlg", <that attack's parameters>}``, or
    ``"auto"`` (the default): every registered attack that applies to the
    scenario, at its measured budget (:mod:`fedsim.scenario.portfolio`); ``[]``
    runs none (the leak analyses alone). ``leaks`` likewise.
    Rounds: the listed ``rounds``, else every ``every``-th round. Victims: the
    listed partitions ``victim-ids`` when sampled, else ``victims`` random
    sampled clients (0 = every sampled client).
    """

    enabled: bool = False
    attacks: tuple[ComponentConfig, ...] | Literal["auto"] = AUTO
    # The other kinds of leak (labels, membership, class representatives): analysis
    # tables, "auto" (every registered analysis that applies), or [] for none.
    leaks: tuple[ComponentConfig, ...] | Literal["auto"] = AUTO
    # What the server observes (fedsim.core.threat): each reply, one batch's gradient at the
    # sent model, or only the example-weighted mean of the round's replies.
    threat_model: ThreatModel = ThreatModel.UPDATE
    # Rounds whose victims are also probed, as a counterfactual: the reconstruction
    # attacks run on one batch's gradient at the sent model, which the server of an
    # ``update`` audit never receives (labelled as the probe in every output).
    probe_rounds: tuple[int, ...] = ()
    # Membership candidates per victim: up to this many records it trained on this
    # round and as many non-members with its class mix from the held-out split.
    candidates: Annotated[int, Ge(2)] = 100
    # Steinke et al.'s one-run audit: this many mislabelled canaries from the held-out
    # split, each in client canary-client's training data on a fair coin (0 = off).
    canaries: Annotated[int, Ge(0), doc("0 = off")] = 0
    canary_client: Annotated[int, Ge(0)] = 0
    # Andrew et al.'s one-shot user-level estimate: this many canary clients, each
    # uploading a random direction at the clipping norm every round, beside the clients
    # under [central-dp] with client-side clipping (0 = off).
    canary_clients: int = 0
    probe_batch_size: Annotated[int, Ge(1)] = 1
    rounds: tuple[int, ...] = ()
    every: Annotated[int, Ge(1)] = 1
    victims: Annotated[int, Ge(0), doc("0 = all sampled")] = 1
    victim_ids: tuple[int, ...] = ()
    mode: Literal["sync", "async"] = "sync"
    workers: Annotated[int, Ge(1)] = 1
    threads_per_attack: Annotated[int, Ge(1)] = 1
    num_gpus: Annotated[float, Ge(0)] = 0.0
    # Optimising reconstruction stops at this many images; a closed-form attack reads up to
    # its own max_batch.
    max_images: Annotated[int, Ge(1)] = RECONSTRUCTION_REACH
    seed: Seed = 0
    precision: Literal["float32", "float64"] = "float32"  # attacks' arithmetic (no TF32)

    def __post_init__(self) -> None:
        object.__setattr__(self, "threat_model", ThreatModel(self.threat_model))  # a name, too
        super().__post_init__()
        require(all(r >= 1 for r in self.rounds), "rounds", self.rounds, "rounds are >= 1")
        require(
            all(r >= 1 for r in self.probe_rounds),
            "probe-rounds",
            self.probe_rounds,
            "rounds are >= 1",
        )
        require(
            self.canary_clients == 0 or self.canary_clients >= 2,
            "canary-clients",
            self.canary_clients,
            "must be 0 (off) or >= 2 (the estimate fits the inserted canaries' spread)",
        )

    def audits_round(self, server_round: int) -> bool:
        if self.rounds:
            return server_round in self.rounds
        return server_round % self.every == 0


@dataclass(frozen=True)
class CentralDPConfig(Bounded):
    """Flower's central differential privacy around the strategy (off by default).

    ``clipping = "server"`` wraps the strategy in Flower's
    ``DifferentialPrivacyServerSideFixedClipping`` (the server clips each reply's update
    to ``clipping-norm``); ``"client"`` in ``DifferentialPrivacyClientSideFixedClipping``,
    with Flower's ``fixedclipping_mod`` clipping on the clients. Either way the server
    adds Gaussian noise of standard deviation ``noise-multiplier * clipping-norm / n`` to
    the mean of the ``n`` sampled clients' models, and Flower's RDP accountant reports
    the user-level epsilon at ``delta`` after every round (without amplification by
    sampling: an upper bound).
    """

    clipping: Literal["off", "server", "client"] = "off"
    noise_multiplier: Annotated[float, Gt(0), doc("Flower's accountant needs noise")] = 1.0
    clipping_norm: Annotated[float, Gt(0)] = 1.0
    delta: Annotated[float, Interval(gt=0, lt=1)] = 1e-5

    @property
    def enabled(self) -> bool:
        return self.clipping != "off"


@dataclass(frozen=True)
class FailureConfig(Bounded):
    """Reply deadline, injected client failures, and how many replies a round needs.

    Each round ``fraction`` of the sampled clients (rounded half up) fail, chosen
    from the seed and the round: ``raise`` makes them raise, ``timeout`` keeps them
    silent past the reply deadline (``timeout`` seconds per phase). ``min-replies``
    (a fraction of the sampled clients) overrides the strategy's own threshold.
    """

    fraction: Annotated[float, Interval(ge=0, le=1)] = 0.0
    kind: Literal["raise", "timeout"] = "raise"
    timeout: Annotated[float, Gt(0), doc("seconds")] = 3600.0
    min_replies: Annotated[
        float | None, Interval(gt=0, le=1), doc("a fraction of the sampled clients")
    ] = None


@dataclass(frozen=True)
class OutputConfig:
    """Where run directories go."""

    dir: str = "runs"


@dataclass(frozen=True)
class LogConfig:
    """Logs besides the run directory's own files.

    ``tensorboard``: per-round scalars and each audited round's reconstruction
    grids in ``RUN_DIR/tensorboard`` (``tensorboard --logdir RUN_DIR``).
    """

    tensorboard: bool = False


@dataclass(frozen=True)
class Scenario:
    """A whole experiment, as loaded from one scenario file.

    ``defences``: client-side defences applied in order to what each client
    uploads (``[[defences]]`` tables ``{name = "gaussian", sigma = 0.01}``;
    see :mod:`fedsim.clients.defences`).

    ``plugins``: code that registers components the scenario names, imported
    before validation in every process of the run: module names, or paths of
    a ``.py`` file or a package folder, relative to the scenario file
    (:mod:`fedsim.core.plugins`; docs/bring-your-own.md).
    """

    name: str = "scenario"
    description: str = ""
    plugins: tuple[str, ...] = ()
    federation: FederationConfig = FederationConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    strategy: ComponentConfig = ComponentConfig("fedavg")
    client: ClientConfig = ClientConfig()
    defences: tuple[ComponentConfig, ...] = ()
    backend: BackendConfig = BackendConfig()
    audit: AuditConfig = AuditConfig()
    central_dp: CentralDPConfig = CentralDPConfig()
    memorisation: MemorisationConfig = field(default_factory=MemorisationConfig)
    failures: FailureConfig = FailureConfig()
    output: OutputConfig = OutputConfig()
    log: LogConfig = LogConfig()

    def __post_init__(self) -> None:
        require_file_name(self.name, "name")  # run folders are named after it
        for i, entry in enumerate(self.plugins):
            require(bool(entry.strip()), f"plugins[{i}]", entry, "must not be empty")
            if not is_path(entry):
                require_module_name(entry, f"plugins[{i}]")
