"""The ``fedsim`` command line: ``fedsim <command> ...``.

Each subcommand is a module in :mod:`fedsim.commands`. Bad input (a
:class:`~fedsim.core.config.ScenarioError`) prints one line naming the key, the
value and what is allowed, and exits with status 2 before any work starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from fedsim import fedsim_version
from fedsim.commands import COMMANDS
from fedsim.core.config import ScenarioError
from fedsim.core.registry import UnknownNameError
from fedsim.simulation.children import end_with_parent
from fedsim.simulation.lifecycle import INTERRUPTED_STATUS, STOP_STATUSES, RunInterrupted


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedsim",
        description="Federated-learning simulations on Flower with a per-round privacy audit.",
    )
    parser.add_argument("--version", action="version", version=f"fedsim {fedsim_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS.names():
        command = COMMANDS.get(name)
        command.add_arguments(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    end_with_parent()  # a child run of a parallel sweep stops when the sweep dies
    # Ctrl-C stops every command even when fedsim started with SIGINT ignored, as a
    # shell's background job does (found in CI: a sweep then never passed it on).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS.get(args.command).run(args)
    except (ScenarioError, UnknownNameError) as err:
        print(f"fedsim: error: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as err:
        print(f"fedsim: {err}", file=sys.stderr)
        return err.status
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling (imports, reading)
        print(f"fedsim: interrupted (SIGINT); {args.command} did not finish", file=sys.stderr)
        return INTERRUPTED_STATUS


def entry() -> None:
    """The ``fedsim`` executable: :func:`main`, then exit with its status.

    A stopped run exits at once, without the interpreter's shutdown: a signal that
    lands in a fork handler leaves the logging module's lock held, and the shutdown
    then waits forever on threads blocked on it (seen in CI after "rounds up to N are
    saved"). Nothing is left to do by then: the outputs are written and closed, and the
    run's Ray processes killed.
    """
    status = main()
    if status in STOP_STATUSES:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
