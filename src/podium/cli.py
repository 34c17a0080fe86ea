"""The `podium` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from podium import env
from podium.config_flags import Flag, add_flags, flag_values
from podium.errors import PodiumError
from podium.errors.render import cli_line


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        # prometheus_client fixes its storage when first imported (some subcommands' modules
        # import it), so an instance claims its metrics directory before anything else
        from podium.metrics.multiproc import prepare_multiproc_dir

        prepare_multiproc_dir()
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except PodiumError as exc:
        print(cli_line(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand; `command` (the one this process runs, when known) lets the others
    whose flags cost imports (`up`, `gateway`: the control loop and the gateway, ~0.5 s of
    every `podium` process) be listed by name and help only."""
    parser = argparse.ArgumentParser(prog="podium", description=__doc__)
    sub = parser.add_subparsers(metavar="COMMAND")
    _add_serve(sub)
    _add_package_commands(sub)
    _add_examples(sub)
    _add_optional(sub, command)
    return parser


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from podium.server.config import ServerConfig

    p = sub.add_parser("serve", help="serve packages (default: the default model)")
    add_flags(p, ServerConfig)  # one flag per field, with its default and doc
    add_key_flags(p)
    p.set_defaults(func=_serve)


class KeyFlags(BaseModel):
    """The client keys of `podium serve`, `podium up` and `podium gateway`: one flag each."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    api_keys: Annotated[list[str], Flag(
        "--api-key", metavar="KEY", env=env.api_key,
        help="an inference key: require 'Authorization: Bearer KEY' (repeatable; env "
             "PODIUM_API_KEY); also opens the admin routes unless an admin key is given")] = []
    """Inference keys; the environment's counts only when no flag gives one."""
    api_key_files: Annotated[list[Path], Flag(
        "--api-key-file", metavar="FILE",
        help="inference keys, one per line, re-read when the file changes (rotation without a "
             "restart; repeatable)")] = []
    """Files of inference keys."""
    admin_keys: Annotated[list[str], Flag(
        "--admin-key", metavar="KEY", env=env.admin_key,
        help="an admin key (repository load/unload, /metrics, control API); repeatable; env "
             "PODIUM_ADMIN_KEY")] = []
    """Admin keys; the environment's counts only when no flag gives one."""
    admin_key_files: Annotated[list[Path], Flag(
        "--admin-key-file", metavar="FILE",
        help="admin keys, one per line, re-read when it changes")] = []
    """Files of admin keys."""


def add_key_flags(p: argparse.ArgumentParser) -> None:
    """--api-key / --api-key-file (inference) and --admin-key / --admin-key-file (admin)."""
    add_flags(p, KeyFlags)


def key_settings(args: argparse.Namespace) -> dict[str, list]:
    """The key flags as settings; the environment's keys count only when no flag gives one."""
    return flag_values(KeyFlags, args)


def _serve(args: argparse.Namespace) -> int:
    from podium.server.config import ServerConfig
    from podium.server.serve import run_server

    values = flag_values(ServerConfig, args)
    if not values["packages"] and values["repository"] is None:
        from podium.package.defaults import write_default_package

        values["packages"] = [write_default_package().root]
    # a value out of its bounds is an InvalidArgument naming the flag
    config = ServerConfig(internal_key=env.take_internal_key(), **values, **key_settings(args))
    return run_server(config)


def _add_package_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("package", help="validate a package directory and write a .tar.gz")
    p.add_argument("source", type=Path)
    p.add_argument("-o", "--output", type=Path, help="default: NAME-VERSION.tar.gz")
    p.set_defaults(func=_package)

    p = sub.add_parser("inspect", help="print a package's manifest, files and what the cache "
                                       "holds for it (weights, compiled engine builds)")
    p.add_argument("package", type=Path)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("materialize", help="announce: put a package's weights into the cache "
                                           "and compile its engine where it runs compiled")
    p.add_argument("package", type=Path, nargs="?",
                   help="package (default: the default model)")
    p.set_defaults(func=_materialize)

    p = sub.add_parser("schema", help="print the JSON Schema of podium.json")
    p.set_defaults(func=_schema)


def _package(args: argparse.Namespace) -> int:
    from podium.package.package import build_package, default_archive_name

    output = args.output or default_archive_name(args.source)
    package = build_package(args.source, output)
    print(f"wrote {output} ({package.key}, {output.stat().st_size} bytes)")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from podium.package.package import open_package
    from podium.package.paths import regular_files

    package = open_package(args.package)
    data = package.manifest.model_dump(mode="json")
    files = [str(f) for f in regular_files(package.root)]
    cached = None
    if package.manifest.backend == "vllm":
        from podium.backends.vllm import engine_build

        cached = engine_build.cached(package)
    from podium.package.adapter import adapter_of

    adapter = adapter_of(package.manifest)
    if adapter is not None:
        cached = {"adapter": {"base": adapter.base_key, "rank": adapter.rank}}
    from podium.backends.batching import DEFAULT_MAX_QUEUE
    from podium.backends.classic_admission import planned

    admission = planned(package.manifest, DEFAULT_MAX_QUEUE)
    if args.json:
        print(json.dumps({"manifest": data, "root": str(package.root), "files": files,
                          "cached": cached, **({"admission": admission} if admission else {})},
                         indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{package.key} ({package.manifest.backend})", show_header=False)
    for key, value in data.items():
        table.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
    table.add_row("files", "\n".join(files))
    if admission is not None:
        table.add_row("admission", f"in-flight bound measured while serving: completions per "
                      f"busy second x {admission['target_wait_s']:g} s "
                      f"({admission['target_wait_source']}), between {admission['floor']} and "
                      f"{admission['ceiling']} (down to {admission['measured_floor']} when "
                      "measured saturated)")
    if adapter is not None:
        table.add_row("adapter of", f"{adapter.base_key} (rank {adapter.rank})")
    elif cached is not None:
        _add_cached_rows(table, cached)
    Console().print(table)
    return 0


def _add_cached_rows(table: object, cached: dict) -> None:
    """The cache's view of a vLLM package: weights, engine mode here, compiled builds."""
    table.add_row("cached weights", cached["weights"] or "not materialized")  # type: ignore
    if cached["engine_mode"]:
        table.add_row("engine mode here", cached["engine_mode"])  # type: ignore[attr-defined]
    for build in cached["compiled"]:
        hw = build["hardware"] or {}
        where = ", ".join(hw.get("gpus") or [hw.get("cpu", "?")])
        table.add_row("compiled" + (" (this machine)" if build["current"] else ""),  # type: ignore
                      f"{build['key'][:12]} {build['engine']} on {where}: {build['files']} "
                      f"files, {build['bytes'] / 1e6:.1f} MB, compiled in "
                      f"{build['compile_seconds']} s, {build['hits']} hits\n{build['path']}")
    if cached["engine_mode"] == "compiled" and not cached["compiled_cached"]:
        table.add_row("compiled (this machine)", "not cached: boot will compile")  # type: ignore


def _materialize(args: argparse.Namespace) -> int:
    from podium.package.cache import ModelCache
    from podium.package.defaults import write_default_package
    from podium.package.package import open_package
    from podium.server.logs import configure_logging

    configure_logging()
    package = open_package(args.package) if args.package else write_default_package()
    if package.manifest.backend == "lora":
        return _materialize_adapter(package)
    entry = ModelCache().materialize(package)
    print(f"{package.key}: {'reused' if entry.reused else 'materialized'} {entry.path}")
    from podium.backends.vllm import engine_build

    print(f"{package.key}: {engine_build.build(package, entry.path)}")
    return 0


def _materialize_adapter(package: object) -> int:
    from podium.errors import PackageError
    from podium.package.adapter_base import info_of, local_base, store_adapter

    info = info_of(package)  # type: ignore[arg-type]
    base = local_base(info)
    if base is None:
        raise PackageError(f"base {info.base_key} is not on this machine (under "
                           "$PODIUM_HOME/packages); announce the adapter to the control "
                           "plane, which knows its base", param="base")
    stored = store_adapter(package, base)  # type: ignore[arg-type]
    print(f"{info.key}: adapter of {info.base_key} (rank {info.rank}) stored at {stored.path}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from podium.package.manifest import manifest_json_schema

    print(json.dumps(manifest_json_schema(), indent=2))
    return 0


def _add_examples(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("examples", help="example model repositories")
    ex = p.add_subparsers(metavar="ACTION")
    c = ex.add_parser("create", help="write a ready repository of example models")
    c.add_argument("directory", type=Path)
    c.add_argument("--no-adapter", action="store_true",
                   help="skip training the LoRA adapter example (support-tone)")
    c.set_defaults(func=_examples_create)


def _examples_create(args: argparse.Namespace) -> int:
    from podium.examples import create_examples

    for path in create_examples(args.directory, with_adapter=not args.no_adapter):
        print(f"wrote {path}")
    return 0


def _add_optional(sub: argparse._SubParsersAction, command: str | None) -> None:
    """Subcommands owned by the control plane and the operator's view."""
    from podium.control.cli import register as register_control
    from podium.pipelines.cli import register as register_pipelines
    from podium.top.cli import register as register_top
    from podium.triton.import_cmd import register as register_import

    register_control(sub, command)
    register_import(sub)
    register_top(sub)
    register_pipelines(sub)


if __name__ == "__main__":
    sys.exit(main())
