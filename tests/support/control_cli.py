"""The control-plane CLI (`podium announce|deploy|status|...`) run in-process."""

from __future__ import annotations

import argparse

from podium.control.cli import register


def podium(*argv: str) -> int:
    """Run the control-plane CLI in-process with `argv`; its exit code."""
    parser = argparse.ArgumentParser(prog="podium")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)
