"""`vramfit` command line: whatif, demo, inspect, serve, node, policies.

The trace replay bench is not part of it: it runs from the source tree as `python -m benchmarks`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def package_version() -> str:
    """The installed distribution's version; a source tree that was never installed reads pyproject.toml."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vramfit")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        try:
            with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vramfit",
        description="Place GPU pods by real VRAM across MIG, MPS, time-slicing and whole GPUs.")
    parser.add_argument("--version", action="version", version=f"vramfit {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from vramfit import demo, inspect, whatif

    whatif.add_parser(sub)
    demo.add_parser(sub)
    inspect.add_parser(sub)
    policies = sub.add_parser("policies", help="list the placement policies in the registry",
                              description="List the placement policies in the registry, one line each. Any of "
                                          "them can be given to --policy of whatif and demo, or set as "
                                          "`policy` in serve's --config file.")
    policies.set_defaults(func=_list_policies)
    # The service lives in its own package; were it missing, the rest of the CLI must still work, but a broken
    # one must not be hidden either.
    try:
        from extender.cli import add_serve_parser
    except ModuleNotFoundError as err:
        if err.name not in ("extender.cli",):
            raise
    else:
        add_serve_parser(sub)
    from nodeagent.cli import add_node_parser

    add_node_parser(sub)
    return parser


def _list_policies(args: argparse.Namespace) -> int:
    from packing.policies import DEFAULT_POLICY, describe_policies

    for name, text in describe_policies().items():
        mark = " (default)" if name == DEFAULT_POLICY else ""
        print(f"{name:<18}{text}{mark}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
        # Flush here, inside the handler: a reader that closed the pipe (`vramfit demo | head -1`) must not
        # turn into a traceback at interpreter exit.
        sys.stdout.flush()
    except BrokenPipeError:
        # As the Python docs advise (signal module, "Note on SIGPIPE"): point stdout at devnull so the
        # interpreter's own final flush does not raise again, and exit as a SIGPIPE'd program would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
