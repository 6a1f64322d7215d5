"""fedsim: federated-learning simulations on Flower with a per-round privacy audit."""

from importlib.metadata import PackageNotFoundError, version


def fedsim_version() -> str:
    """The installed fedsim's version."""
    try:
        return version("fedsim")
    except PackageNotFoundError:  # a checkout that is not installed
        return "(not installed)"
