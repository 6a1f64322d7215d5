"""Is a well-formed scenario runnable? Checked before Ray starts, so bad input costs nothing.

:func:`fedsim.core.config.load_scenario` checks a scenario's form (keys, types,
ranges, finite numbers, seeds). Here, what it means, in two steps:

- :func:`check_components`: every name a scenario gives is registered, every
  component's parameters are valid, the components fit together (strategy,
  defences, attacks, audit victims and rounds) and the model's shapes work at
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

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fedsim.attacks import ATTACKS
from fedsim.attacks.leakage import LEAKS
from fedsim.clients import CLIENT_ROUTINES
from fedsim.clients.defences import DEFENCES, check_defences
from fedsim.core.components import Resolved, resolve
from fedsim.core.config import DataConfig, Scenario, ScenarioError, first_line, lookup, require
from fedsim.core.data import (
    DATASETS,
    check_dataset_available,
    generated_dataset,
    load_raw,
    shaped_channels,
)
from fedsim.core.devices import test_logical_gpus
from fedsim.core.generated import GeneratedDataset
from fedsim.core.models import INITS, MODELS, InputSpec, SplitNet
from fedsim.core.partition import PARTITIONERS, local_test_count, partition_dataset
from fedsim.core.plugins import RegistrationError, use_plugins
from fedsim.core.training import smallest_batch
from fedsim.scenario.portfolio import AuditPlan, check_audit
from fedsim.strategies import STRATEGIES
from fedsim.strategies.base import EngineHooks


@dataclass(frozen=True)
class Components:
    """A valid scenario's components, resolved: the strategy and what the audit runs
    (empty without an audit), each class with its frozen parameters."""

    scenario: Scenario
    strategy: Resolved
    audit: AuditPlan = field(default_factory=AuditPlan)

    @property
    def attacks(self) -> tuple[Resolved, ...]:
        """The audit's reconstruction attacks on its threat model's observations."""
        return self.audit.attacks


MAX_ACTORS_PER_CORE = 4
"""Flower starts ``ray-cpus / num-cpus`` client actors; more per core flood the machine."""

BYTES_PER_VALUE = 4  # float32 images


def _image_spec(image_size: int, rgb: bool) -> InputSpec:
    # The side length decides the shapes; channels and classes do not break any zoo model.
    return InputSpec(3 if rgb else 1, image_size, 10)


def _dry_forward(
    builder: Callable[[InputSpec], torch.nn.Module], spec: InputSpec, train: bool
) -> None:
    """One example through the model ``builder`` makes, on the ``meta`` device (shapes only)."""
    image_size = spec.image_size
    with torch.device("meta"):
        model = builder(spec)
        if not isinstance(model, SplitNet):  # a plugin's builder: FedSplit and attacks need it
            raise TypeError(
                f"it builds a {type(model).__qualname__}, not a fedsim.core.models.SplitNet "
                "(an extractor, then a classifier)"
            )
        model.train(train)(torch.zeros(1, spec.channels, image_size, image_size))


def check_model_fits(model: str, image_size: int, rgb: bool, key: str) -> None:
    """One example passes through model ``model`` at ``image_size`` (shapes only); else
    a :class:`ScenarioError` on ``key``."""
    # Outside the try: an unknown name is a model.name error, not a shape error.
    builder = lookup(MODELS, model, "model.name")
    try:
        # Eval mode: batch norm in training mode refuses a batch of one 1x1 map
        # (that is :func:`trains_on_one_example`'s question).
        _dry_forward(builder, _image_spec(image_size, rgb), train=False)
    except TypeError as err:
        raise ScenarioError("model.name", model, first_line(err)) from None
    except (RuntimeError, ValueError) as err:
        raise ScenarioError(
            key, image_size, f"does not fit model {model!r} ({first_line(err)}); try 32"
        ) from None


def trains_on_one_example(scenario: Scenario) -> bool:
    """Whether the model can take a training step on a batch of one example (batch
    norm over a 1x1 feature map, as ResNet-18's last block at 8 pixels, cannot)."""
    data = scenario.data
    builder = lookup(MODELS, scenario.model.name, "model.name")
    generator = generated_dataset(data)
    spec = (
        _generated_spec(generator, data)
        if generator
        else _image_spec(data.image_size, data.channels == "rgb")
    )
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


def check_plugins(scenario: Scenario) -> None:
    """Import the scenario's ``plugins`` and load every registry's plugins now, so that
    one that fails to import, clashes or registers the wrong kind is refused before any work."""
    use_plugins(scenario.plugins)
    for registry in PLUGGABLE:
        try:
            registry.names()
        except RegistrationError as err:  # fedsim's own modules, loaded after a plugin's
            raise ScenarioError("plugins", list(scenario.plugins), str(err)) from None


def check_stragglers(scenario: Scenario, strategy_cls: type[EngineHooks]) -> None:
    """Stragglers need a strategy that says what to do with them, and epochs to cut."""
    stragglers = scenario.federation.stragglers
    if stragglers == 0:
        return
    able = sorted(name for name in STRATEGIES.names() if STRATEGIES.get(name).straggler_replies)
    require(
        strategy_cls.straggler_replies is not None,
        "federation.stragglers",
        stragglers,
        f"strategy {scenario.strategy.name!r} cannot run stragglers; these can: {', '.join(able)}",
    )
    require(
        scenario.client.local_steps == 0,
        "federation.stragglers",
        stragglers,
        "stragglers do fewer local epochs, so client.local-steps must be 0",
    )


def check_components(scenario: Scenario) -> Components:
    """Every name and parameter the scenario gives and how they fit, resolved; raise
    ScenarioError."""
    check_plugins(scenario)
    lookup(DATASETS, scenario.data.dataset, "data.dataset")
    lookup(INITS, scenario.model.init, "model.init")
    data = scenario.data
    generator = generated_dataset(data)
    if generator:
        check_generated(scenario, generator)
    else:
        require(
            not data.generator.params,
            "data.generator",
            data.generator.params,
            f"dataset {data.dataset!r} is stored, not generated; only generated datasets "
            f"({', '.join(generated_names())}) take parameters",
        )
        check_model_fits(
            scenario.model.name, data.image_size, data.channels == "rgb", "data.image-size"
        )
    resolve(PARTITIONERS, scenario.data.partitioner, "data.partitioner")
    strategy = resolve(STRATEGIES, scenario.strategy, "strategy")
    strategy.cls.check_scenario(scenario)
    check_stragglers(scenario, strategy.cls)
    check_defences(scenario)
    enabled = scenario.audit.enabled
    audit = check_audit(scenario, strategy.cls.shared_prefixes) if enabled else AuditPlan()
    return Components(scenario, strategy, audit)


def generated_names() -> list[str]:
    """The registered datasets generated per device."""
    return [n for n in DATASETS.names() if isinstance(DATASETS.get(n), GeneratedDataset)]


def _generated_spec(generator: GeneratedDataset, data: DataConfig) -> InputSpec:
    features, classes = generator.shape(generator.params(data))
    return InputSpec(features, 1, classes)


def check_generated(scenario: Scenario, generator: GeneratedDataset) -> None:
    """A generated dataset's parameters, and what it cannot be combined with.

    Its examples are feature vectors split by device: no partitioner, no image
    shaping, no image attacks; the model must take ``(features, 1, 1)`` inputs.
    """
    data = scenario.data
    spec = _generated_spec(generator, data)  # parses data.generator
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
        not scenario.audit.enabled,
        "audit.enabled",
        True,
        f"dataset {name!r} holds {spec.channels}-feature vectors, not images: the audit's "
        "gradient-inversion attacks and image scores need images; set it false",
    )
    builder = lookup(MODELS, scenario.model.name, "model.name")
    try:
        _dry_forward(builder, spec, train=False)
    except TypeError as err:
        raise ScenarioError("model.name", scenario.model.name, first_line(err)) from None
    except (RuntimeError, ValueError) as err:
        raise ScenarioError(
            "model.name",
            scenario.model.name,
            f"does not take dataset {name!r}'s {spec.channels}-feature vectors "
            f"({first_line(err)}); use a model that flattens its input: logreg, mlp-2nn",
        ) from None


def check_generated_clients(scenario: Scenario, generator: GeneratedDataset) -> None:
    """Every device of a generated dataset has training and test examples; the server's
    test devices lie in the federation. Draws no example and no device beyond the
    smallest size the generator guarantees (the population is never generated)."""
    data, fed = scenario.data, scenario.federation
    params = generator.params(data)
    test_devices = generator.test_devices(params)
    require(
        test_devices <= fed.num_clients,
        "data.generator.test-devices",
        test_devices,
        f"must be at most federation.num-clients ({fed.num_clients}): the server's test set "
        "is fresh examples of the federation's first devices",
    )
    held = generator.min_size(params)
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
    if not trains_on_one_example(scenario):
        raise ScenarioError(
            "model.name",
            scenario.model.name,
            "cannot train on a last batch of one example, and a generated dataset's device "
            "sizes are not all drawn before the run; use a model without batch norm",
        )


def check_gpu_request(num_gpus: float, key: str) -> None:
    """Ray waits forever for GPUs that do not exist; refuse instead.

    Tests alone may grant logical GPUs (:data:`~fedsim.core.devices.TEST_LOGICAL_GPUS_ENV`):
    Ray then schedules GPU shares and everything runs on CPU.
    """
    if num_gpus > 0 and not torch.cuda.is_available() and not test_logical_gpus():
        raise ScenarioError(key, num_gpus, "must be 0 on a machine without a CUDA GPU")


def ray_cpus(scenario: Scenario) -> int:
    """Logical CPUs of a local Ray head (``backend.ray-cpus``; 0 = this machine's cores)."""
    return scenario.backend.ray_cpus or os.cpu_count() or 1


def actor_count(scenario: Scenario) -> int:
    """Client actors Flower starts on this machine: one per ``num-cpus`` CPUs."""
    return max(1, int(ray_cpus(scenario) / scenario.backend.num_cpus))


def check_resources(scenario: Scenario) -> None:
    """A local Ray head gets no more logical CPUs and actors than this machine can serve."""
    backend = scenario.backend
    if backend.address:  # a cluster's size is the cluster's business
        return
    cores = os.cpu_count() or 1
    limit = MAX_ACTORS_PER_CORE * cores
    require(
        backend.ray_cpus <= limit,
        "backend.ray-cpus",
        backend.ray_cpus,
        f"must be at most {limit} ({MAX_ACTORS_PER_CORE} per core of this machine's {cores})",
    )
    require(
        actor_count(scenario) <= limit,
        "backend.num-cpus",
        backend.num_cpus,
        f"starts {actor_count(scenario)} client actors (ray-cpus / num-cpus); "
        f"at most {limit} fit this machine's {cores} cores",
    )


def physical_memory() -> int:
    """Bytes of RAM on this machine."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_data_fits(scenario: Scenario) -> None:
    """Clients have examples to hold, and the resized dataset fits in memory.

    The driver and every client actor each hold the whole dataset at the image size.
    """
    data, fed = scenario.data, scenario.federation
    raw = load_raw(data)
    num_train = len(raw.train_labels)
    require(
        fed.num_clients <= num_train,
        "federation.num-clients",
        fed.num_clients,
        f"must be at most {num_train}, the training examples of {data.dataset}",
    )
    images = num_train + len(raw.test_labels)
    per_process = images * shaped_channels(raw, data) * data.image_size**2 * BYTES_PER_VALUE
    processes = 1 + (1 if scenario.backend.address else actor_count(scenario))
    needed, have = per_process * processes, physical_memory()
    require(
        needed <= have,
        "data.image-size",
        data.image_size,
        f"{images} images at this size need {per_process / 2**30:.1f} GiB in each of "
        f"{processes} processes, more than this machine's {have / 2**30:.1f} GiB",
    )


def check_partition(scenario: Scenario) -> None:
    """The partitioner can split the data, leaving every client training and test examples."""
    data, fed = scenario.data, scenario.federation
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
        if smallest_batch(len(split.train), scenario.client) == 1
    ]
    if single and not trains_on_one_example(scenario):
        client, examples = single[0]
        batch_size = scenario.client.batch_size
        raise ScenarioError(
            "client.batch-size",
            batch_size,
            (
                "gives batches of one"
                if batch_size == 1
                else f"leaves client {client} ({examples} training examples) a last batch of one"
            )
            + f", on which model {scenario.model.name!r} at data.image-size "
            f"{data.image_size} cannot train (batch norm over a 1x1 feature map); "
            "choose a batch size that leaves no single example over, or a larger image",
        )


def check_machine(scenario: Scenario) -> None:
    """This machine can run ``scenario``: GPUs, cores, data files, memory, partition."""
    check_gpu_request(scenario.backend.num_gpus, "backend.num-gpus")
    if scenario.audit.enabled:
        check_gpu_request(scenario.audit.num_gpus, "audit.num-gpus")
    check_resources(scenario)
    check_dataset_available(scenario.data)
    generator = generated_dataset(scenario.data)
    if generator:  # nothing stored to fit in memory, no population-wide partition
        check_generated_clients(scenario, generator)
    else:
        check_data_fits(scenario)
        check_partition(scenario)


def validate(scenario: Scenario) -> Components:
    """:func:`check_components` then :func:`check_machine`; the scenario's components."""
    components = check_components(scenario)
    check_machine(scenario)
    return components
