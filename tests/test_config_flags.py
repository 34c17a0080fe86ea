"""The three process configs (`podium serve`, `podium up`, `podium gateway`): every field is a
generated flag or says why not, the flags default to the fields' defaults, and a bad value is
refused on construction naming the flag, the value and the bound."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from podium.cli import KeyFlags, build_parser
from podium.config_flags import flag_of, flag_values, not_a_flag
from podium.control.up import UpConfig
from podium.errors import InvalidArgument
from podium.gateway.process import GatewayConfig
from podium.server.config import ServerConfig

COMMANDS = {"serve": ServerConfig, "up": UpConfig, "gateway": GatewayConfig}


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


@pytest.mark.parametrize(("command", "model"), [
    *COMMANDS.items(), *((command, KeyFlags) for command in COMMANDS)],
    ids=[*COMMANDS, *(f"{command}-keys" for command in COMMANDS)])
def test_every_field_is_a_generated_flag_or_says_why_not(command: str,
                                                         model: type[BaseModel]) -> None:
    parser = _subparser(command)
    options = {o for a in parser._actions for o in a.option_strings} | {
        a.dest for a in parser._actions if not a.option_strings}
    for name, info in model.model_fields.items():
        flag, other = flag_of(info), not_a_flag(info)
        assert (flag is None) != (other is None), f"{model.__name__}.{name}: Flag or NotAFlag"
        assert info.description, f"{model.__name__}.{name} has no one-line doc"
        if other is not None:
            assert other.reason, f"{model.__name__}.{name}: NotAFlag says why"
            continue
        assert flag is not None and flag.name in options, (
            f"{model.__name__}.{name}: {flag.name} is not a flag of podium {command}")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_flags_default_to_the_fields_defaults(command: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PODIUM_DATABASE_URL", "PODIUM_CONTROL_URL", "PODIUM_CONTROL_KEY"):
        monkeypatch.delenv(name, raising=False)
    model = COMMANDS[command]
    values = flag_values(model, _subparser(command).parse_args([]))
    assert model(**values) == model()


@pytest.mark.parametrize(("command", "argv", "field", "value"), [
    ("serve", ["--max-n", "4"], "max_n", 4),
    ("serve", ["--shutdown-timeout", "2.5"], "shutdown_timeout_s", 2.5),
    ("serve", ["--log-format", "json"], "log_format", "json"),
    ("serve", ["--metrics-open"], "metrics_open", True),
    ("serve", ["a", "b"], "packages", [Path("a"), Path("b")]),
    ("up", ["--gateways", "0"], "num_gateways", 0),
    ("up", ["--package-root", "/x", "--package-root", "/y"], "package_roots",
     [Path("/x"), Path("/y")]),
    ("up", ["--runtime", "ray"], "runtime", "ray"),
    ("gateway", ["--id", "g1"], "gateway_id", "g1"),
    ("gateway", ["--reuse-port"], "reuse_port", True),
], ids=["serve-int", "serve-seconds", "serve-choice", "serve-switch", "serve-positional",
        "up-renamed", "up-repeated", "up-choice", "gateway-renamed", "gateway-switch"])
def test_a_flag_sets_its_field(command: str, argv: list[str], field: str, value: Any) -> None:
    assert flag_values(COMMANDS[command], _subparser(command).parse_args(argv))[field] == value


@pytest.mark.parametrize(("environ", "argv", "api_keys"), [
    ({}, [], []),
    ({"PODIUM_API_KEY": "from-env"}, [], ["from-env"]),
    ({"PODIUM_API_KEY": "from-env"}, ["--api-key", "a", "--api-key", "b"], ["a", "b"]),
], ids=["none", "env-when-no-flag", "flags-replace-env"])
def test_the_environments_key_counts_only_when_no_flag_gives_one(
        monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], argv: list[str],
        api_keys: list[str]) -> None:
    monkeypatch.delenv("PODIUM_API_KEY", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    for command in COMMANDS:
        args = _subparser(command).parse_args(argv)
        assert flag_values(KeyFlags, args)["api_keys"] == api_keys


def test_version_ttl_in_seconds_becomes_the_loops_milliseconds() -> None:
    values = flag_values(UpConfig, _subparser("up").parse_args(["--version-ttl", "1.5"]))
    assert values["loop"].version_ttl_ms == 1500


BAD = {
    # (config, field, value): what the refusal says (the flag, the value, the bound or type)
    "serve-port-high": (ServerConfig, "http_port", 70000,
                        "--http-port 70000: Input should be less than or equal to 65535"),
    "serve-grpc-low": (ServerConfig, "grpc_port", -2,
                       "--grpc-port -2: Input should be greater than or equal to -1"),
    "serve-port-str": (ServerConfig, "http_port", "80", "--http-port '80': Input should be a "
                       "valid integer"),
    "serve-bool-int": (ServerConfig, "max_json_depth", True, "--max-json-depth True: Input "
                       "should be a valid integer"),
    "serve-depth": (ServerConfig, "max_json_depth", 501,
                    "--max-json-depth 501: Input should be less than or equal to 500"),
    "serve-body": (ServerConfig, "max_body_bytes", 10,
                   "--max-body-bytes 10: Input should be greater than or equal to 1024"),
    "serve-queue": (ServerConfig, "max_queue", 0,
                    "--max-queue 0: Input should be greater than or equal to 1"),
    "serve-shutdown": (ServerConfig, "shutdown_timeout_s", -1.0,
                       "--shutdown-timeout -1.0: Input should be greater than or equal to 0"),
    "serve-level": (ServerConfig, "log_level", "loud", "--log-level 'loud': Input should be "
                    "'debug', 'info', 'warning' or 'error'"),
    "serve-empty-key": (ServerConfig, "api_keys", [""],
                        "--api-key '': String should have at least 1 character"),
    "serve-key-file": (ServerConfig, "api_key_files", ["/nowhere/keys"],
                       "--api-key-file '/nowhere/keys': Path does not point to a file"),
    "serve-unknown": (ServerConfig, "max_bananas", 1, "max_bananas 1: Extra inputs are not "
                      "permitted"),
    "up-gateways": (UpConfig, "num_gateways", 17,
                    "--gateways 17: Input should be less than or equal to 16"),
    "up-gateways-bool": (UpConfig, "num_gateways", True,
                         "--gateways True: Input should be a valid integer"),
    "up-api-port": (UpConfig, "api_port", 65536,
                    "--api-port 65536: Input should be less than or equal to 65535"),
    "up-api-body": (UpConfig, "api_max_body_bytes", 1024**3 + 1, "--api-max-body-bytes "
                    "1073741825: Input should be less than or equal to 1073741824"),
    "up-api-head": (UpConfig, "api_max_header_bytes", 0, "--api-max-header-bytes 0: Input "
                    "should be greater than or equal to 1024"),
    "up-shutdown": (UpConfig, "shutdown_timeout_s", 0.5,
                    "--shutdown-timeout 0.5: Input should be greater than or equal to 1"),
    "up-runtime": (UpConfig, "runtime", "k8s",
                   "--runtime 'k8s': Input should be 'local' or 'ray'"),
    "gateway-port": (GatewayConfig, "http_port", -1,
                     "--http-port -1: Input should be greater than or equal to 0"),
    "gateway-shutdown": (GatewayConfig, "shutdown_timeout_s", 3601.0,
                         "--shutdown-timeout 3601.0: Input should be less than or equal to "
                         "3600"),
    "gateway-reuse-str": (GatewayConfig, "reuse_port", "yes",
                          "--reuse-port 'yes': Input should be a valid boolean"),
}


@pytest.mark.parametrize(("model", "field", "value", "says"), BAD.values(), ids=list(BAD))
def test_a_bad_value_is_refused_naming_the_flag_and_the_bound(
        model: type[BaseModel], field: str, value: Any, says: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        model(**{field: value})
    assert str(refused.value) == says


@pytest.mark.parametrize(("argv", "says"), [
    (["serve", "--repository", "/nowhere", "--max-n", "0"],
     "--max-n 0: Input should be greater than or equal to 1"),
    (["up", "--gateways", "17"], "--gateways 17: Input should be less than or equal to 16"),
    (["up", "--shutdown-timeout", "0"],
     "--shutdown-timeout 0.0: Input should be greater than or equal to 1"),
    (["gateway", "--grpc-port", "-5"],
     "--grpc-port -5: Input should be greater than or equal to -1"),
], ids=["serve", "up-gateways", "up-shutdown", "gateway"])
def test_a_bad_flag_stops_the_command_before_it_starts(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from podium.cli import main

    monkeypatch.setattr("podium.metrics.multiproc.prepare_multiproc_dir", lambda: None)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"podium: error: {says}"
