"""tinylab: an example fedsim plugin with its own model, dataset, attack and strategy.

Installed, its entry points (``pyproject.toml``) load each module in the registry
that needs it. Named in a scenario's ``plugins`` key (this folder's path), the
package is imported as a whole: importing it imports every module, so everything
registers.
"""

from tinylab import attacks, clients, data, models, protocol, strategies

__all__ = ["attacks", "clients", "data", "models", "protocol", "strategies"]
