"""A mode's facts live in its module: no shipped file outside `packing/modes/` names a `Mode` member, except a
vendor translating its own words into modes (`packing/vendors/`). The files below still do, with how many
references each may have: the list may only shrink (move the branch to a `ModeRules` fact, then delete the entry)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("packing", "extender", "nodeagent", "vramfit", "kubeio")
HOMES = ("packing/modes/", "packing/vendors/")
MEMBER = re.compile(r"\bMode\.([A-Z][A-Z_]*)\b")

# Not yet asking the rules (file -> references): each is a branch on a mode outside its home.
NOT_YET: dict[str, int] = {}


def _references() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(HOMES):
                continue
            n = len(MEMBER.findall(path.read_text()))
            if n:
                found[rel] = n
    return found


def test_mode_members_are_named_only_in_their_homes() -> None:
    grown = {f: n for f, n in _references().items() if n > NOT_YET.get(f, 0)}
    assert grown == {}, f"branch on a ModeRules fact instead of naming a Mode member: {grown}"


def test_the_not_yet_list_only_shrinks() -> None:
    found = _references()
    stale = {f: (n, found.get(f, 0)) for f, n in NOT_YET.items() if found.get(f, 0) < n}
    assert stale == {}, f"lower or delete these entries (allowed, found): {stale}"
