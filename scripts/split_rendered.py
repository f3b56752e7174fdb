#!/usr/bin/env python3
"""Split `helm template` output (stdin) into one file per chart template, into the directory given.

Helm sorts the rendered objects by kind (its install order) and marks each with `# Source: <chart>/templates/
<file>`; this puts every object back into the file of its template, in the order the template lists them
(matched by `kind:` and `metadata.name`), so manifests/ reads like the templates, comments included.
Used by scripts/render-manifests.sh and tests/test_chart.py; needs no third-party module.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SOURCE = re.compile(r"^# Source: [^/]+/templates/(?P<file>\S+)\n", re.M)
SEPARATOR = re.compile(r"^---[ \t]*$", re.M)
KIND = re.compile(r"^kind:\s*(\S+)", re.M)
NAME = re.compile(r"^metadata:\n(?:(?:  .*|\s*)\n)*?  name:\s*(\S+)", re.M)


def _key(text: str) -> tuple[str, str]:
    kind, name = KIND.search(text), NAME.search(text)
    return (kind.group(1) if kind else "", name.group(1) if name else "")


def template_order(template: Path) -> list[tuple[str, str]]:
    """(kind, name) of each object of a template file, in document order (a templated name stays raw)."""
    return [_key(chunk) for chunk in SEPARATOR.split(template.read_text()) if KIND.search(chunk)]


def _position(key: tuple[str, str], order: list[tuple[str, str]]) -> int:
    if key in order:
        return order.index(key)
    kinds = [kind for kind, _ in order]
    return kinds.index(key[0]) if key[0] in kinds else len(order)


def split(rendered: str, templates: Path) -> dict[str, str]:
    """File name -> its objects as YAML text, in template order."""
    by_file: dict[str, list[str]] = {}
    for doc in SEPARATOR.split(rendered):
        match = SOURCE.search(doc)
        if match is None:
            if doc.strip():
                raise SystemExit(f"a rendered document without a '# Source:' line: {doc[:80]!r}")
            continue
        body = SOURCE.sub("", doc, count=1).strip("\n")
        by_file.setdefault(match.group("file"), []).append(body)
    out = {}
    for name, docs in by_file.items():
        order = template_order(templates / name)
        docs.sort(key=lambda d: _position(_key(d), order))  # stable: ties keep helm's order
        out[name] = "\n---\n".join(docs) + "\n"
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: split_rendered.py CHART_TEMPLATES_DIR OUT_DIR < rendered.yaml", file=sys.stderr)
        return 2
    templates, out_dir = Path(argv[1]), Path(argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(split(sys.stdin.read(), templates).items()):
        (out_dir / name).write_text(text)
        print(f"wrote {out_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
