"""Ready scenario files (package data): ``fedsim run quickstart`` finds them from any folder.

The one rule for naming a scenario, on the command line and in the Flower app's
run config alike: a path to a file, else a shipped scenario by name
(``quickstart``, ``quickstart.toml`` or ``scenarios/quickstart.toml``).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped_scenarios() -> list[str]:
    """Names of the scenario files shipped with fedsim (``quickstart``, ...)."""
    folder = files(__name__)
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


def scenario_path(given: str) -> Path:
    """``given`` if it is a file, else the shipped scenario it names: ``quickstart``,
    ``quickstart.toml`` or ``scenarios/quickstart.toml`` work from any folder.
    A name that is neither is returned as is (reading it gives the error)."""
    path = Path(given)
    if path.is_file():
        return path
    shipped = files(__name__) / f"{path.name.removesuffix('.toml')}.toml"
    return Path(str(shipped)) if shipped.is_file() else path
