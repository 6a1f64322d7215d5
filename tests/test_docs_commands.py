"""The README and docs say what runs: every command they show parses, and every link resolves.

Nothing here runs a simulation. Each shell block of ``README.md``, ``docs/*.md`` and the
``bench`` READMEs is cut into commands, and each command is checked against what it names:

- ``fedsim ...``: fedsim's own argument parser accepts it; a scenario it runs loads (with its
  ``--set`` overrides), a sweep spec exists, and the attack, dataset, model and init it names
  are registered;
- ``python bench/X.py ...`` / ``python examples/X.py``: the script exists and declares every
  flag given to it; ``bash bench/X.sh ...``: the script exists and its argument loop takes every
  flag; ``make X``: the Makefile has target X;
- ``flwr run``, ``flower-superlink``, ``flower-supernode``, ``ray start``: every flag is in
  that command's ``--help`` (skipped where the command is not installed beside this interpreter);
- ``pip install -e PATH``: the folder of this repository exists.

Every TOML block loads as a scenario (or, for a sweep spec, parses), inline ``fedsim ...``
spans name a real subcommand and its real flags, and every relative link between the pages
points to a file that exists and, with ``#anchor``, to a heading in it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from fedsim.commands.list import KINDS

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "bench").glob("**/README.md"),
    ]
)
BIN = Path(sys.executable).parent
# Commands a block may hold that only set up the shell; nothing of fedsim to check.
SHELL_ONLY = {"export", "mkdir", "printf", "cat", "cd"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _blocks(lang: str) -> list[tuple[str, str]]:
    return [
        (_rel(page), match.group(2))
        for page in PAGES
        for match in FENCE.finditer(page.read_text())
        if match.group(1) == lang
    ]


def _commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists: continuations joined, comments, heredoc
    bodies and leading ``VAR=value`` assignments dropped, split at ``&&``, ``;``, ``&``."""
    lines, heredoc = [], None
    for line in block.replace("\\\n", " ").splitlines():
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        match = re.search(r"<<-?\s*'?(\w+)'?", line)
        if match:
            heredoc = match.group(1)
            line = line[: match.start()]
        lines.append(line)
    commands: list[list[str]] = []
    for line in lines:
        current: list[str] = []
        for token in shlex.split(line, comments=True):
            if token in ("&&", ";", "&", "||", "|"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    out = []
    for command in commands:
        while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", command[0]):
            command = command[1:]
        if command:
            out.append(command)
    return out


SHELL_COMMANDS = [
    (page, command) for page, block in _blocks("bash") for command in _commands(block)
]


def _id(item: tuple[str, list[str]]) -> str:
    page, command = item
    return f"{page}: {' '.join(command)[:70]}"


# --- fedsim -----------------------------------------------------------------------------


@cache
def _parser() -> argparse.ArgumentParser:
    from fedsim.cli import build_parser

    return build_parser()


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("fedsim's parser has no subcommands")


def _registered(kind: str, name: str) -> bool:
    from fedsim.attacks import ATTACKS
    from fedsim.core.data import DATASETS
    from fedsim.core.models import INITS, MODELS

    registry = {"attack": ATTACKS, "dataset": DATASETS, "model": MODELS, "init": INITS}[kind]
    return name in registry


def _scenario_file(given: str) -> Path:
    path = ROOT / given
    if path.is_file():
        return path
    return ROOT / "fedsim" / "scenarios" / f"{Path(given).name.removesuffix('.toml')}.toml"


def _check_fedsim(argv: list[str]) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = _parser().parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code == 0, f"fedsim {' '.join(argv)}: {err.getvalue().strip()}"
        return  # --version, --help
    if args.command == "run" and args.scenario:
        from fedsim.core.scenario_file import load_scenario

        path = _scenario_file(args.scenario)
        assert path.is_file(), f"no scenario {args.scenario!r}"
        load_scenario(path, args.overrides)
    elif args.command == "compare":
        assert _scenario_file(args.spec).is_file(), f"no sweep spec {args.spec!r}"
    elif args.command == "attack":
        for kind in ("attack", "dataset", "model", "init"):
            name = getattr(args, kind)
            if name is not None:
                assert _registered(kind, name), f"--{kind} {name}: not registered"
    elif args.command == "list" and args.kind:
        assert args.kind in KINDS, args.kind


# --- scripts, make, Flower ---------------------------------------------------------------


def _python_flags(script: Path) -> set[str]:
    flags: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            flags |= {
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value[:1] == "-"
            }
    return flags | {"-h", "--help"}


def _shell_flags(script: Path) -> set[str]:
    flags = set()
    for match in re.finditer(r"^\s*([-\w|]+)\)", script.read_text(), re.M):
        flags |= {f for f in match.group(1).split("|") if f.startswith("-")}
    return flags


def _given_flags(argv: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("-") and not a[1:2].isdigit()}


def _check_script(argv: list[str], flags_of: Callable[[Path], set[str]]) -> None:
    script = ROOT / argv[0]
    assert script.is_file(), f"no script {argv[0]}"
    declared = flags_of(script)
    unknown = _given_flags(argv[1:]) - declared
    assert not unknown, f"{argv[0]} has no {sorted(unknown)}"


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


@cache
def _help(program: str, *sub: str) -> str:
    exe = BIN / program
    if not exe.is_file():
        pytest.skip(f"{program} is not installed beside {sys.executable}")
    env = {**os.environ, "COLUMNS": "200", "FLWR_TELEMETRY_ENABLED": "0"}
    done = subprocess.run(
        [str(exe), *sub, "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    return done.stdout + done.stderr


# Installed tools whose flags are checked against their ``--help``, and the one
# subcommand of each that the docs may show (None: the program takes flags only).
TOOLS = {"flwr": "run", "ray": "start", "flower-superlink": None, "flower-supernode": None}


def _check_tool(argv: list[str]) -> None:
    program, rest = Path(argv[0]).name, argv[1:]
    sub: tuple[str, ...] = ()
    if TOOLS[program] is not None:
        assert rest and rest[0] == TOOLS[program], f"only `{program} {TOOLS[program]}`: {argv}"
        sub, rest = (rest[0],), rest[1:]
    text = _help(program, *sub)
    missing = {f for f in _given_flags(rest) if not re.search(re.escape(f) + r"\b", text)}
    assert not missing, f"{' '.join([program, *sub])} --help lists no {sorted(missing)}"


@pytest.mark.parametrize(("page", "command"), SHELL_COMMANDS, ids=[_id(c) for c in SHELL_COMMANDS])
def test_every_shell_command_in_the_docs_is_real(page: str, command: list[str]) -> None:
    program = Path(command[0]).name
    if program == "fedsim":
        _check_fedsim(command[1:])
    elif program in ("python", "python3"):
        _check_script(command[1:], _python_flags)
    elif program == "bash":
        _check_script(command[1:], _shell_flags)
    elif program == "make":
        missing = set(command[1:]) - _make_targets()
        assert not missing, f"the Makefile has no target {sorted(missing)}"
    elif program in TOOLS:
        _check_tool(command)
    elif program == "pip":  # installing a folder of this repository (its path is checked below)
        assert command[1:3] == ["install", "-e"] and len(command) == 4, command
    else:
        assert program in SHELL_ONLY, f"{page}: no check for {program!r}; add one here"
    for token in command[1:]:
        if re.match(r"(scenarios|bench|examples|tests)/", token) and "*" not in token:
            assert (ROOT / token).exists(), f"{page}: {token} does not exist"


def test_the_readme_shows_the_two_commands() -> None:
    commands = [c for page, c in SHELL_COMMANDS if page == "README.md"]
    assert ["make", "demo"] in commands and ["make", "test"] in commands


@pytest.mark.parametrize(("page", "block"), _blocks("toml"), ids=lambda v: str(v)[:60])
def test_every_toml_block_loads(page: str, block: str, tmp_path: Path) -> None:
    raw = tomllib.loads(block)
    if "strategies" in raw or "seeds" in raw:
        return  # a fedsim compare spec: parsed above
    from fedsim.core.scenario_file import load_scenario

    path = tmp_path / "block.toml"
    path.write_text(block)
    load_scenario(path)


def _spans(text: str) -> list[str]:
    text = FENCE.sub("", text)
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", text)]


INLINE = [
    (_rel(page), span)
    for page in PAGES
    for span in _spans(page.read_text())
    if re.match(r"(\.venv/bin/)?fedsim \w", span)
]


@pytest.mark.parametrize(("page", "span"), INLINE, ids=lambda v: str(v)[:60])
def test_inline_fedsim_commands_name_real_subcommands_and_flags(page: str, span: str) -> None:
    words = span.split()
    sub = _subparsers()
    if words[1].startswith("-"):
        assert words[1] in ("--version", "--help", "-h"), span
        return
    assert words[1] in sub, f"{page}: `{span}`: no subcommand {words[1]!r}"
    options = set(sub[words[1]]._option_string_actions)
    unknown = {w for w in _given_flags([w.strip("[]") for w in words[2:]]) if w not in options}
    assert not unknown, f"{page}: `{span}`: fedsim {words[1]} has no {sorted(unknown)}"


# --- links -------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for match in re.finditer(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = _slug(match.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


LINKS = [
    (_rel(page), target)
    for page in PAGES
    for target in re.findall(
        r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", FENCE.sub("", page.read_text()))
    )
    if not re.match(r"[a-z]+:", target)
]


@pytest.mark.parametrize(("page", "target"), LINKS, ids=lambda v: str(v)[-60:])
def test_every_relative_link_resolves(page: str, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (ROOT / page).parent / path if path else ROOT / page
    assert file.exists(), f"{page}: {target} points to no file"
    if anchor:
        assert file.suffix == ".md", f"{page}: {target}: an anchor into a non-page"
        assert anchor in _anchors(file.resolve()), f"{page}: {target}: no such heading"


def test_every_docs_page_is_in_the_table_of_contents() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not link {page.name}"
