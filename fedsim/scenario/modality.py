"""Components and data of one modality: every pairing checked before any work.

A dataset, a model, an attack, a leak analysis and a strategy each declare the
modality they are for (:func:`fedsim.core.modality.modality_of`; a strategy
that declares none runs any). Naming one with data of another modality is one
line naming both and the components that fit the data.
"""

from __future__ import annotations

from typing import Any

from fedsim.core.components import Resolved
from fedsim.core.config import DataConfig, FederationConfig, require
from fedsim.core.data import DATASETS
from fedsim.core.memorisation import MemorisationConfig
from fedsim.core.modality import ANY, TEXT, modality_of
from fedsim.core.models import InputSpec
from fedsim.core.registry import Registry
from fedsim.core.scenario_file import lookup


def data_modality(data: DataConfig) -> str:
    """The modality of ``data.dataset`` (read from its loader, nothing loaded)."""
    return modality_of(DATASETS.get(data.dataset))


def data_spec(data: DataConfig) -> InputSpec:
    """What a model of ``data`` is built for, without loading it: the loader's own spec
    (a text loader's window and vocabulary) or an image's at the scenario's size."""
    loader = DATASETS.get(data.dataset)
    own = getattr(loader, "input_spec", None)
    if own is not None:
        spec: InputSpec = own()
        return spec
    # The side length decides the shapes; channels and classes do not break any zoo model.
    return InputSpec(3 if data.channels == "rgb" else 1, data.image_size, 10)


def fits(component: Any, data: DataConfig, default: str) -> bool:
    """Whether ``component`` (declaring its modality, else ``default``) takes ``data``."""
    have = modality_of(component, default)
    return have in (ANY, data_modality(data))


def check_pairing(
    registry: Registry[Any], key: str, name: str, data: DataConfig, default: str = "image"
) -> None:
    """Refuse ``registry``'s component ``name`` (given at ``key``) for data of another
    modality, naming the components of ``registry`` that take it."""
    check_fits(registry, lookup(registry, name, key), key, name, data, default)


def check_fits(
    registry: Registry[Any], component: Any, key: str, name: str, data: DataConfig, default: str
) -> None:
    """Refuse ``component`` (``registry``'s ``name``, given at ``key``) for data of another
    modality, naming the components of ``registry`` that take it."""
    if fits(component, data, default):
        return
    want, have = data_modality(data), modality_of(component, default)
    allowed = [n for n in registry.names() if fits(registry.get(n), data, default)]
    require(
        False,
        key,
        name,
        f"is {'an' if have[0] in 'aeiou' else 'a'} {have} {registry.kind}, and data.dataset "
        f"{data.dataset!r} is {want}; allowed with {want} data: {', '.join(allowed) or 'none'}",
    )


def check_memorisation(
    memorisation: MemorisationConfig, data: DataConfig, fed: FederationConfig, strategy: Resolved
) -> None:
    """``[memorisation]`` plants token canaries: text data, planting clients that exist, and
    a strategy that releases a global model to measure their exposure on."""
    if not memorisation.enabled:
        return
    clients = fed.num_clients
    want = data_modality(data)
    require(
        want == TEXT,
        "memorisation.enabled",
        True,
        f"plants token canaries, and data.dataset {data.dataset!r} is {want}; text datasets: "
        + ", ".join(n for n in DATASETS.names() if modality_of(DATASETS.get(n)) == TEXT),
    )
    require(
        max(memorisation.clients) < clients,
        "memorisation.clients",
        list(memorisation.clients),
        f"partition ids are 0 to {clients - 1} (federation.num-clients)",
    )
    require(
        strategy.cls.global_model,
        "memorisation.enabled",
        True,
        f"measures exposure on the released global model, and strategy {strategy.name!r} "
        "keeps part of each model private; use a strategy with a global model (fedavg, fedprox)",
    )
