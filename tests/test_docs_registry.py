"""The docs' lists of components agree with the registries: a docs table that names an attack,
leak analysis or `fedsim list` kind the code lacks, or misses one it has, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from fedsim.attacks import ATTACKS
from fedsim.attacks.leakage import LEAK_KINDS, LEAKS
from fedsim.commands.list import KINDS
from fedsim.scenario.portfolio import auto_attacks

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def _first_column(table_text: str) -> set[str]:
    """Backticked names in the first cell of each row of the first table in ``table_text``."""
    rows = [line for line in table_text.splitlines() if line.startswith("| `")]
    names: set[str] = set()
    for row in rows:
        names |= set(re.findall(r"`([a-z0-9-]+)`", row.split("|")[1]))
    return names


def _backticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z0-9-]+)`", text))


def test_the_attack_table_lists_every_registered_attack() -> None:
    table = _first_column(_section("attacks.md", "# "))
    aliases = {"ig"}
    assert table - aliases == set(ATTACKS.names())


def test_the_leak_table_lists_every_analysis_with_its_kind() -> None:
    rows = [line for line in (DOCS / "leaks.md").read_text().splitlines() if line.startswith("| `")]
    documented = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) > 1 and cells[1] in LEAK_KINDS:
            documented[cells[0].strip("`")] = cells[1]
    assert documented == {name: LEAKS.get(name).kind for name in LEAKS.names()}


def test_the_portfolio_section_names_every_portfolio_attack() -> None:
    section = _section("audit.md", '## The portfolio: `attacks = "auto"`')
    assert _backticked(section) & set(ATTACKS.names()) == set(auto_attacks())


def test_fedsim_list_kinds_are_the_documented_ones() -> None:
    line = next(
        line for line in (DOCS / "scenarios.md").read_text().splitlines() if "fedsim list " in line
    )
    documented = [k.strip() for k in line.split("#", 1)[1].split(",")]
    assert documented == list(KINDS)


def test_the_portfolio_keeps_only_the_order_and_variants_follow_their_family() -> None:
    # The house issue's bound: an attack carries its own presets and capabilities, so the
    # portfolio names at most 15 attacks; the defence-aware variants join by their class.
    source = (Path(__file__).resolve().parents[1] / "fedsim/scenario/portfolio.py").read_text()
    named = [s for s in re.findall(r'"([a-z-]+)"', source) if s in ATTACKS]
    order = auto_attacks()
    assert len(named) <= 15, named
    assert order.index("dlg-defence-aware") == order.index("dlg") + 1
    assert order.index("ig-defence-aware") == order.index("inverting-gradients") + 1
