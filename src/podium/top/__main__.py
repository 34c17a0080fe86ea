"""`python -m podium.top URL...`, the same as `podium top URL...`."""

from __future__ import annotations

import argparse
import sys

from podium.top.cli import register


def main(argv: list[str] | None = None) -> int:
    """Parse `top`'s arguments on their own and run the view."""
    parser = argparse.ArgumentParser(prog="podium")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["top", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
