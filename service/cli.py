"""The `lingstream` command line."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lingstream", description="Interactive world-model video sessions.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the HTTP service")
    args = parser.parse_args(argv)
    if args.command == "serve":
        sys.stderr.write("lingstream serve: the REST service has not landed yet (see the open issues)\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
