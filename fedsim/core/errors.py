"""The one-line refusal of bad input, below every other kernel module.

:mod:`fedsim.core.config` re-exports it (where callers import it from); it lives
here so that the registry and the plugin loader, which the configuration
imports, can raise it too.
"""

from __future__ import annotations


class ScenarioError(ValueError):
    """Invalid scenario input: names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key} = {value!r}: {allowed}")


def first_line(err: BaseException) -> str:
    """An exception's first line for a one-line refusal (its type when it has no text)."""
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def require(condition: bool, key: str, value: object, allowed: str) -> None:
    """Raise :class:`ScenarioError` unless ``condition`` holds."""
    if not condition:
        raise ScenarioError(key, value, allowed)
