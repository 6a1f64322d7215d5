"""Is a well-formed scenario runnable? Checked before Ray starts, so bad input costs nothing.

:func:`fedsim.core.scenario_file.load_scenario` checks a scenario's form (keys, types,
ranges, finite numbers, seeds). Here, what it means, in two steps:

- :func:`check_components`: every name a scenario gives is registered, every
  component's parameters are valid, the components fit together (strategy,
  defences, attacks, audit victims and rounds; the pairs are
  :mod:`fedsim.scenario.applicability`'s) and the model's shapes work at
  the image size (a dry forward pass on PyTorch's ``meta`` device: shapes
  only, no memory). Needs no data and no hardware.
- :func:`check_machine`: this machine can run it: its GPUs exist, its Ray
  actors fit the cores, its dataset files are present and well-formed, the
  dataset fits in memory at the image size in every process that loads it,
  and the partition gives every client training (and test) examples.

Every failure is a :class:`~fedsim.core.config.ScenarioError`: one line with
the key, the value and what is allowed. What passes is resolved once into
:class:`Components`: downstream receives those, never a raw parameter table.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedsim.attacks import ATTACKS
from fedsim.attacks.base import AttackSetting
from fedsim.attacks.leakage import LEAKS
from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.defences import DEFENCES, check_defences
from fedsim.core import protocol
from fedsim.core.components import Resolved, resolve
from fedsim.core.config import (
    AuditConfig,
    CentralDPConfig,
    ClientConfig,
    DataConfig,
    FailureConfig,
    FederationConfig,
    ModelConfig,
    Scenario,
    ScenarioError,
    first_line,
    require,
)
from fedsim.core.data import (
    DATASETS,
    check_dataset_available,
    load_dataset,
)
from fedsim.core.generated import GeneratedDataset
from fedsim.core.modality import ANY, modality
from fedsim.core.models import INITS, MODELS, InputSpec, SplitNet
from fedsim.core.partition import (
    PARTITIONERS,
    local_test_count,
    partition_dataset,
    resolve_generator,
    resolve_partitioner,
)
from fedsim.core.plugins import RegistrationError, use_plugins
from fedsim.core.scenario_file import lookup
from fedsim.core.training import smallest_batch
from fedsim.scenario.applicability import (
    audit_notes,
    check_defence_threat,
    check_strategy_threat,
    check_threat_options,
)
from fedsim.scenario.components import Components, client_spec
from fedsim.scenario.machine import check_data_fits, check_gpu_request, check_resources
from fedsim.scenario.modality import check_memorisation, check_pairing, data_spec
from fedsim.scenario.portfolio import AuditPlan, check_audit
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import EngineHooks


def _dry_forward(
    builder: Callable[[InputSpec], torch.nn.Module], spec: InputSpec, train: bool
) -> None:
    """One example through the model ``builder`` makes, on the CPU without gradients.

    Not on the ``meta`` device: its first forward imports ``torch._dynamo`` (1.3-2.7 s
    in every process that validates a scenario), and the server builds the model anyway.
    """
    with torch.device("cpu"), torch.no_grad():
        model = builder(spec)
        if not isinstance(model, SplitNet):  # a plugin's builder: FedSplit and attacks need it
            raise TypeError(
                f"it builds a {type(model).__qualname__}, not a fedsim.core.models.SplitNet "
                "(an extractor, then a classifier)"
            )
        model.train(train)(modality(spec.modality).dry_input(spec))


def check_model_fits(model: str, spec: InputSpec, key: str) -> None:
    """One example of ``spec`` passes through model ``model`` (shapes only); else a
    :class:`ScenarioError` on ``key`` (the image size's)."""
    # Outside the try: an unknown name is a model.name error, not a shape error.
    builder = lookup(MODELS, model, "model.name")
    try:
        # Eval mode: batch norm in training mode refuses a batch of one 1x1 map
        # (that is :func:`trains_on_one_example`'s question).
        _dry_forward(builder, spec, train=False)
    except TypeError as err:
        raise ScenarioError("model.name", model, first_line(err)) from None
    except (RuntimeError, ValueError) as err:
        raise ScenarioError(
            key, spec.image_size, f"does not fit model {model!r} ({first_line(err)}); try 32"
        ) from None


def trains_on_one_example(
    model: ModelConfig, data: DataConfig, generator: Resolved | None = None
) -> bool:
    """Whether ``model`` can take a training step on a batch of one example of ``data``, or
    of its resolved ``generator`` (batch norm over a 1x1 feature map, as ResNet-18's last
    block at 8 pixels, cannot)."""
    builder = lookup(MODELS, model.name, "model.name")
    spec = _generated_spec(generator) if generator else data_spec(data)
    try:
        _dry_forward(builder, spec, train=True)
    except ValueError:  # batch norm's "Expected more than 1 value per channel"
        return False
    return True


PLUGGABLE = (
    *(MODELS, INITS, DATASETS, PARTITIONERS, STRATEGIES, CLIENT_ROUTINES, DEFENCES),
    *(ATTACKS, LEAKS),
)
"""The registries plugins add to (each loads its entry-point group on its first lookup)."""


def check_plugins(plugins: tuple[str, ...]) -> None:
    """Import a scenario's ``plugins`` and load every registry's plugins now, so that
    one that fails to import, clashes or registers the wrong kind is refused before any work."""
    use_plugins(plugins)
    for registry in PLUGGABLE:
        try:
            registry.names()
        except RegistrationError as err:  # fedsim's own modules, loaded after a plugin's
            raise ScenarioError("plugins", list(plugins), str(err)) from None


def check_stragglers(
    fed: FederationConfig, client: ClientConfig, strategy: str, strategy_cls: type[EngineHooks]
) -> None:
    """Stragglers need a strategy that says what to do with them, and epochs to cut."""
    stragglers = fed.stragglers
    if stragglers == 0:
        return
    able = sorted(name for name in STRATEGIES.names() if STRATEGIES.get(name).straggler_replies)
    require(
        strategy_cls.straggler_replies is not None,
        "federation.stragglers",
        stragglers,
        f"strategy {strategy!r} cannot run stragglers; these can: {', '.join(able)}",
    )
    require(
        client.local_steps == 0,
        "federation.stragglers",
        stragglers,
        "stragglers do fewer local epochs, so client.local-steps must be 0",
    )


def check_central_dp(
    central: CentralDPConfig,
    fed: FederationConfig,
    failures: FailureConfig,
    data: DataConfig,
    model: ModelConfig,
    strategy: Resolved,
) -> None:
    """Flower's central DP calibrates its noise to the plain mean of every sampled client's
    clipped update, and scales and noises every uploaded array."""
    strategy_cls = strategy.cls
    if not central.enabled:
        return
    key, value = "central-dp.clipping", central.clipping
    able = sorted(name for name in STRATEGIES.names() if STRATEGIES.get(name).plain_mean)
    require(
        strategy_cls.plain_mean,
        key,
        value,
        f"strategy {strategy.name!r} does not release the plain mean of the uploads, to which "
        f"Flower's central DP calibrates its noise; these do: {', '.join(able)}",
    )
    require(
        fed.stragglers == 0 and failures.fraction == 0,
        key,
        value,
        "Flower's accountant counts every sampled client in each release; set "
        "federation.stragglers = 0 and failures.fraction = 0",
    )
    spec = data_spec(data)
    with torch.device("meta"):
        state = MODELS.get(model.name)(spec).state_dict()
    prefixes = strategy_cls.shared_prefixes
    uploaded = state if prefixes is None else protocol.keep_prefixed(state, prefixes)
    counters = [name for name, tensor in uploaded.items() if not tensor.is_floating_point()]
    require(
        not counters,
        key,
        value,
        f"Flower's central DP scales and noises every uploaded array, and model "
        f"{model.name!r} uploads integer ones ({counters[0] if counters else ''}, "
        "BatchNorm's counter); use a model without BatchNorm or a strategy that keeps it "
        "private (fedsplit)",
    )


def check_canary_clients(audit: AuditConfig, central: CentralDPConfig) -> None:
    """Canary clients upload a direction at the clipping norm, which client-side clipping
    leaves unchanged; server-side clipping would clip them with the clients' updates."""
    require(
        not (audit.enabled and audit.canary_clients) or central.clipping == "client",
        "audit.canary-clients",
        audit.canary_clients,
        "estimate user-level epsilon under Flower's central DP with client-side clipping: "
        f'set central-dp.clipping = "client" (it is {central.clipping!r}), or canary-clients = 0',
    )


def check_equal_partitions(data: DataConfig, fed: FederationConfig) -> None:
    """Central DP's noise (``clipping-norm / n`` per client) assumes equal client weights."""
    splits = partition_dataset(data, fed.num_clients, fed.seed)
    sizes = sorted({len(split.train) for split in splits})
    require(
        len(sizes) == 1,
        "central-dp.clipping",
        "on",
        f"Flower's central DP weighs every client equally (noise for clipping-norm / n), and "
        f"fedsim's strategies weigh them by examples: the partition gives clients "
        f"{sizes[0]} to {sizes[-1]} training examples; use data.samples-per-client or a "
        "number of clients that divides the data",
    )


def check_components(scenario: Scenario) -> Components:
    """Every name and parameter the scenario gives and how they fit, resolved; raise
    ScenarioError."""
    check_plugins(scenario.plugins)
    lookup(DATASETS, scenario.data.dataset, "data.dataset")
    lookup(INITS, scenario.model.init, "model.init")
    data = scenario.data
    generator = resolve_generator(data)  # parses data.generator
    if generator:
        check_generated(data, scenario.model, scenario.audit.enabled, generator)
    else:
        require(
            not data.generator.params,
            "data.generator",
            data.generator.params,
            f"dataset {data.dataset!r} is stored, not generated; only generated datasets "
            f"({', '.join(generated_names())}) take parameters",
        )
        check_pairing(MODELS, "model.name", scenario.model.name, data)
        check_model_fits(scenario.model.name, data_spec(data), "data.image-size")
    partitioner = resolve_partitioner(data)
    strategy = resolve(STRATEGIES, scenario.strategy, "strategy")
    check_pairing(STRATEGIES, "strategy.name", scenario.strategy.name, data, ANY)
    check_memorisation(scenario.memorisation, data, scenario.federation, strategy)
    strategy.cls.check_model(scenario.model, data)
    check_stragglers(scenario.federation, scenario.client, strategy.name, strategy.cls)
    check_strategy_threat(scenario.audit, scenario.federation, strategy.name, strategy.cls)
    check_threat_options(scenario.audit, scenario.central_dp)
    check_central_dp(
        scenario.central_dp,
        scenario.federation,
        scenario.failures,
        data,
        scenario.model,
        strategy,
    )
    check_canary_clients(scenario.audit, scenario.central_dp)
    client = client_spec(scenario, partitioner, generator)
    audit_threat = scenario.audit.threat_model if scenario.audit.enabled else None
    check_defence_threat(client.defences, audit_threat)
    check_defences(client, scenario.strategy.name)
    audit = AuditPlan()
    if scenario.audit.enabled:
        setting = AttackSetting.of(scenario, strategy.cls.shared_prefixes)
        notes = audit_notes(scenario.audit, scenario.federation, strategy.name, strategy.cls)
        audit = check_audit(scenario.audit, scenario.federation, setting, notes)
    return Components(scenario, strategy, client, audit)


def generated_names() -> list[str]:
    """The registered datasets generated per device."""
    return [n for n in DATASETS.names() if isinstance(DATASETS.get(n), GeneratedDataset)]


def _generated_spec(generator: Resolved) -> InputSpec:
    features, classes = generator.cls.shape(generator.params)
    return InputSpec(features, 1, classes)


def check_generated(
    data: DataConfig, model: ModelConfig, audited: bool, generator: Resolved
) -> None:
    """A generated dataset's parameters, and what it cannot be combined with.

    Its examples are feature vectors split by device: no partitioner, no image
    shaping, no image attacks (no audit); ``model`` must take ``(features, 1, 1)`` inputs.
    """
    spec = _generated_spec(generator)
    name = data.dataset
    require(
        data.partitioner.name == "iid" and not data.partitioner.params,
        "data.partitioner",
        data.partitioner.name,
        f"dataset {name!r} is generated per device, not split by a partitioner; leave it out",
    )
    require(
        not data.normalize,
        "data.normalize",
        data.normalize,
        f"dataset {name!r} is generated feature vectors, used as drawn; set it false",
    )
    require(
        data.channels == "native",
        "data.channels",
        data.channels,
        f"dataset {name!r} holds feature vectors, not images; leave it native",
    )
    require(
        not audited,
        "audit.enabled",
        True,
        f"dataset {name!r} holds {spec.channels}-feature vectors, not images: the audit's "
        "gradient-inversion attacks and image scores need images; set it false",
    )
    builder = lookup(MODELS, model.name, "model.name")
    try:
        _dry_forward(builder, spec, train=False)
    except TypeError as err:
        raise ScenarioError("model.name", model.name, first_line(err)) from None
    except (RuntimeError, ValueError) as err:
        raise ScenarioError(
            "model.name",
            model.name,
            f"does not take dataset {name!r}'s {spec.channels}-feature vectors "
            f"({first_line(err)}); use a model that flattens its input: logreg, mlp-2nn",
        ) from None


def check_generated_clients(
    data: DataConfig, fed: FederationConfig, model: ModelConfig, generator: Resolved
) -> None:
    """Every device of a generated dataset has training and test examples; the server's
    test devices lie in the federation. Draws no example and no device beyond the
    smallest size the generator guarantees (the population is never generated)."""
    params, dataset = generator.params, generator.cls
    test_devices = dataset.test_devices(params)
    require(
        test_devices <= fed.num_clients,
        "data.generator.test-devices",
        test_devices,
        f"must be at most federation.num-clients ({fed.num_clients}): the server's test set "
        "is fresh examples of the federation's first devices",
    )
    held = dataset.min_size(params)
    if data.samples_per_client:
        held = min(held, data.samples_per_client)
    num_test = local_test_count(data, held)
    require(
        held - num_test > 0,
        "data.test-fraction",
        data.test_fraction,
        f"leaves a device of {held} examples no training examples; lower it",
    )
    require(
        num_test > 0 or data.test_fraction == 0,
        "data.test-fraction",
        data.test_fraction,
        f"leaves a device of {held} examples no test examples; raise it or data.samples-per-client",
    )
    if not trains_on_one_example(model, data, generator):
        raise ScenarioError(
            "model.name",
            model.name,
            "cannot train on a last batch of one example, and a generated dataset's device "
            "sizes are not all drawn before the run; use a model without batch norm",
        )


def check_partition(
    data: DataConfig, fed: FederationConfig, train: ClientConfig, model: ModelConfig
) -> None:
    """The partitioner can split the data, leaving every client training and test examples
    (and every last batch trainable by ``model``)."""
    try:
        splits = partition_dataset(data, fed.num_clients, fed.seed)
    except ValueError as err:  # a partitioner's own limit (dirichlet's min-size)
        raise ScenarioError("data.partitioner", data.partitioner.name, str(err)) from None
    for client, split in enumerate(splits):
        held = len(split.train) + len(split.test)
        require(
            held > 0,
            "federation.num-clients",
            fed.num_clients,
            f"partitioner {data.partitioner.name!r} gives client {client} no examples; "
            "use fewer clients or another partitioner",
        )
        require(
            len(split.train) > 0,
            "data.test-fraction",
            data.test_fraction,
            f"leaves client {client} no training examples (it holds {held}); lower it",
        )
        require(
            len(split.test) > 0 or not split.from_test_set,
            "data.local-eval-source",
            data.local_eval_source,
            f"the test set is too small to give each of {fed.num_clients} clients a "
            "validation and a test slice; use fewer clients",
        )
        require(
            len(split.test) > 0 or data.test_fraction == 0,
            "data.test-fraction",
            data.test_fraction,
            f"leaves client {client} no test examples (it holds {held}); raise it, "
            "raise data.samples-per-client, or use fewer clients",
        )
    # Clients whose training cuts a batch of one example (the model is asked once).
    single = [
        (client, len(split.train))
        for client, split in enumerate(splits)
        if smallest_batch(len(split.train), train) == 1
    ]
    if single and not trains_on_one_example(model, data):
        client, examples = single[0]
        batch_size = train.batch_size
        raise ScenarioError(
            "client.batch-size",
            batch_size,
            (
                "gives batches of one"
                if batch_size == 1
                else f"leaves client {client} ({examples} training examples) a last batch of one"
            )
            + f", on which model {model.name!r} at data.image-size "
            f"{data.image_size} cannot train (batch norm over a 1x1 feature map); "
            "choose a batch size that leaves no single example over, or a larger image",
        )


def check_canary_pool(data: DataConfig, canaries: int) -> None:
    """The held-out split gives ``canaries`` records and keeps at least as many for the
    audit's public half and non-members."""
    held_out = len(load_dataset(data).test_labels)
    require(
        canaries <= held_out // 2,
        "audit.canaries",
        canaries,
        f"at most {held_out // 2}: half of dataset {data.dataset!r}'s held-out split of "
        f"{held_out} (the rest is the audit's public data and non-members)",
    )


def check_machine(scenario: Scenario) -> None:
    """This machine can run ``scenario``: GPUs, cores, data files, memory, partition."""
    check_gpu_request(scenario.backend.num_gpus, "backend.num-gpus")
    if scenario.audit.enabled:
        check_gpu_request(scenario.audit.num_gpus, "audit.num-gpus")
    data, fed, backend = scenario.data, scenario.federation, scenario.backend
    check_resources(backend)
    check_dataset_available(data)
    generator = resolve_generator(data)
    if generator:  # nothing stored to fit in memory, no population-wide partition
        check_generated_clients(data, fed, scenario.model, generator)
    else:
        check_data_fits(data, fed, backend)
        check_partition(data, fed, scenario.client, scenario.model)
        if scenario.central_dp.enabled:
            check_equal_partitions(data, fed)
        if scenario.audit.enabled and scenario.audit.canaries:
            check_canary_pool(data, scenario.audit.canaries)


def validate(scenario: Scenario) -> Components:
    """:func:`check_components` then :func:`check_machine`; the scenario's components."""
    components = check_components(scenario)
    check_machine(scenario)
    return components
