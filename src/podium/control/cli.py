"""`podium up | gateway | announce | deploy | scale | status | regions | gateways | rollouts |
rollout pause|resume | rollback | events`: the control plane's CLI.

Every command but `up` is a client of the REST API (PODIUM_CONTROL_URL, default
http://127.0.0.1:8080). A rejected request prints the API's message and exits 2; an API that
cannot be reached or fails (5xx) exits 1; an answer that is not JSON is shown with its status
and text, never parsed blindly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from podium import env
from podium.gateway import limits

UP_HELP = "run control plane + gateway + instances"
GATEWAY_HELP = "run one gateway process following a control plane (podium up starts its own)"


def register(subparsers: argparse._SubParsersAction, command: str | None = None) -> None:
    """Add the control-plane subcommands to `podium`. `up` and `gateway` get their flags when
    `command` (the subcommand this process runs) is theirs or not known (None, `--help`):
    their configs import the control loop and the gateway; otherwise name and help only."""
    def full(name: str) -> bool:
        return command is None or command == name or command.startswith("-")

    if full("up"):
        _add_up(subparsers)
    else:
        subparsers.add_parser("up", help=UP_HELP)
    if full("gateway"):
        _add_gateway(subparsers)
    else:
        subparsers.add_parser("gateway", help=GATEWAY_HELP)
    _add_clients(subparsers)


def _add_up(subparsers: argparse._SubParsersAction) -> None:
    from podium.cli import add_key_flags
    from podium.config_flags import add_flags
    from podium.control.up_config import UpConfig

    p = subparsers.add_parser("up", help=UP_HELP)
    add_flags(p, UpConfig)  # one flag per field, with its default and doc
    p.add_argument("--region", dest="regions", action="append", default=[],
                   metavar="name=N,http=PORT,grpc=PORT[,runtime=ray][,ray-address=HOST:PORT]",
                   help="declare a region with its own runtime and gateway (repeatable; "
                        "rollouts go through them in this order); default: one region on "
                        "--runtime and --http-port/--grpc-port")
    p.add_argument("--regions-file", type=Path, metavar="FILE",
                   help="regions from a TOML ([[region]] tables) or JSON file, instead of "
                        "--region flags")
    add_key_flags(p)  # inference keys guard the gateway, admin keys the API (and /metrics)
    limits.add_flags(p)
    p.set_defaults(func=_up)


def _add_gateway(subparsers: argparse._SubParsersAction) -> None:
    from podium.cli import add_key_flags
    from podium.config_flags import add_flags
    from podium.gateway.process import GatewayConfig

    p = subparsers.add_parser("gateway", help=GATEWAY_HELP)
    add_flags(p, GatewayConfig)
    add_key_flags(p)  # what clients must send: inference keys, admin keys for /metrics
    limits.add_flags(p)
    p.set_defaults(func=_gateway)


def _add_clients(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("announce", help="register + materialize a package")
    p.add_argument("package", type=Path)
    _api_arg(p)
    p.set_defaults(func=_announce)

    p = subparsers.add_parser("deploy", help="roll MODEL@VERSION out")
    p.add_argument("target", metavar="MODEL@VERSION")
    p.add_argument("--strategy", choices=["red-black", "versioned"], default="red-black")
    p.add_argument("--stages", help="Red-Black traffic stages in percent, e.g. 10,25,50,100")
    p.add_argument("--instances", type=int, help="instances of the new version at 100%%")
    p.add_argument("--analysis-window", type=float, help="seconds each stage is observed")
    p.add_argument("--warm-delay", type=float, help="seconds old instances stay warm")
    p.add_argument("--ready-timeout", type=float, help="seconds a new instance may take")
    p.add_argument("--latency-checks", type=int,
                   help="consecutive slow windows before a latency regression rolls back")
    p.add_argument("--regions", metavar="A,B",
                   help="regions to roll out to, in this order (default: every region)")
    p.add_argument("--bake", type=float, metavar="SECONDS",
                   help="between regions: how long a finished region bakes (default 300)")
    p.add_argument("--region-failure", choices=["roll-back-all", "keep-earlier"],
                   help="when a region fails: roll the earlier regions back too (default) or "
                        "let them keep the new version")
    _api_arg(p)
    p.set_defaults(func=_deploy)

    p = subparsers.add_parser("scale", help="set autoscaling bounds of MODEL@VERSION")
    p.add_argument("target", metavar="MODEL@VERSION")
    p.add_argument("--min", dest="min_instances", type=int, required=True)
    p.add_argument("--max", dest="max_instances", type=int, required=True)
    p.add_argument("--region", help="only this region (default: every region it lives in)")
    _api_arg(p)
    p.set_defaults(func=_scale)

    p = subparsers.add_parser("status", help="deployments, instances, splits")
    _api_arg(p)
    p.set_defaults(func=lambda a: _show(a, "GET", "/v1/status"))

    p = subparsers.add_parser("regions", help="declared regions in rollout order")
    _api_arg(p)
    p.set_defaults(func=lambda a: _show(a, "GET", "/v1/regions"))

    p = subparsers.add_parser("gateways", help="gateway processes and whether each routes by "
                              "the current table")
    _api_arg(p)
    p.set_defaults(func=lambda a: _show(a, "GET", "/v1/gateways"))

    p = subparsers.add_parser("rollouts", help="rollouts, newest first")
    p.add_argument("model", nargs="?")
    _api_arg(p)
    p.set_defaults(func=lambda a: _show(a, "GET", "/v1/rollouts",
                                        params={"model": a.model} if a.model else None))

    p = subparsers.add_parser("events", help="what the control plane did and why, newest first")
    p.add_argument("model", nargs="?", help="only this model's events")
    p.add_argument("--limit", type=int, default=20, help="at most this many (1-1000)")
    p.add_argument("--before", type=int, metavar="ID",
                   help="only events older than event ID (page back through history)")
    _api_arg(p)
    p.set_defaults(func=lambda a: _show(a, "GET", "/v1/events", params={
        "limit": str(a.limit), **({"model": a.model} if a.model else {}),
        **({"before": str(a.before)} if a.before is not None else {})}))

    p = subparsers.add_parser("rollout", help="pause or resume a running rollout")
    actions = p.add_subparsers(dest="action", required=True, metavar="pause|resume")
    for action, text in (("pause", "hold rollout ID at its stage (no step, no analysis)"),
                         ("resume", "continue paused rollout ID where it stood")):
        q = actions.add_parser(action, help=text)
        q.add_argument("rollout_id", type=int, metavar="ID", help="as `podium rollouts` lists")
        _api_arg(q)
        q.set_defaults(func=lambda a: _show(a, "POST",
                                            f"/v1/rollouts/{a.rollout_id}/{a.action}"))

    p = subparsers.add_parser("rollback", help="roll MODEL back")
    p.add_argument("model")
    _api_arg(p)
    p.set_defaults(func=lambda a: _show(a, "POST", f"/v1/models/{a.model}/rollback"))


def _api_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api", default=env.control_url(),
                   help="control-plane API URL (env PODIUM_CONTROL_URL)")
    p.add_argument("--api-key", default=env.client_key(),
                   help="admin key of a control plane started with --admin-key (or its "
                        "--api-key when it has none); env PODIUM_ADMIN_KEY, else PODIUM_API_KEY")
    p.add_argument("--json", action="store_true", help="print the raw JSON answer")


def _up(args: argparse.Namespace) -> int:
    from podium.auth_keys import KeyConfig
    from podium.cli import key_settings
    from podium.config_flags import flag_values
    from podium.control.region_config import load_file, parse_flag
    from podium.control.up import UpConfig, run_up
    from podium.errors import InvalidArgument

    regions = [parse_flag(text) for text in args.regions]
    if args.regions_file is not None:
        if regions:
            raise InvalidArgument("give regions by --region or --regions-file, not both",
                                  param="regions")
        regions = load_file(args.regions_file)
    return run_up(UpConfig(
        **flag_values(UpConfig, args), regions=tuple(regions), limits=limits.from_flags(args),
        keys=KeyConfig(**{k: tuple(v) for k, v in key_settings(args).items()})))


def _gateway(args: argparse.Namespace) -> int:
    from podium.auth_keys import KeyConfig
    from podium.cli import key_settings
    from podium.config_flags import flag_values
    from podium.gateway.process import GatewayConfig, run_gateway

    settings = key_settings(args)
    given = env.take_gateway_keys()  # from podium up
    keys = KeyConfig(
        api_keys=(*settings["api_keys"], *given.get("api_keys", ())),  # type: ignore[misc]
        api_key_files=tuple(settings["api_key_files"]),  # type: ignore[arg-type]
        admin_keys=(*settings["admin_keys"], *given.get("admin_keys", ())),  # type: ignore[misc]
        admin_key_files=tuple(settings["admin_key_files"]))  # type: ignore[arg-type]
    values = flag_values(GatewayConfig, args)
    values["control_key"] = values["control_key"] or next(
        iter((*keys.admin_keys, *keys.api_keys)), None)
    return run_gateway(GatewayConfig(**values, keys=keys, credential=env.take_internal_key(),
                                     limits=limits.from_flags(args)))


def _announce(args: argparse.Namespace) -> int:
    return _show(args, "POST", "/v1/packages", body={"path": str(args.package.resolve())})


def _target(command: str, target: str) -> tuple[str, str] | None:
    model, sep, version = target.partition("@")
    if not sep or not model or not version:
        print(f"podium {command}: {target!r} must be MODEL@VERSION, e.g. iris@2",
              file=sys.stderr)
        return None
    return model, version


def _scale(args: argparse.Namespace) -> int:
    target = _target("scale", args.target)
    if target is None:
        return 2
    model, version = target
    return _show(args, "PUT", f"/v1/deployments/{model}/{version}/scaling",
                 body={"min_instances": args.min_instances, "max_instances": args.max_instances,
                       **({"region": args.region} if args.region else {})})


def _deploy(args: argparse.Namespace) -> int:
    target = _target("deploy", args.target)
    if target is None:
        return 2
    model, version = target
    body: dict[str, Any] = {"model": model, "version": version, "strategy": args.strategy}
    if args.stages:
        try:
            body["stages"] = [int(s) for s in args.stages.split(",")]
        except ValueError:
            print(f"podium deploy: --stages={args.stages!r} must be integers like 10,25,50,100",
                  file=sys.stderr)
            return 2
    for flag, key in (("analysis_window", "analysis_window_ms"), ("warm_delay", "warm_delay_ms"),
                      ("ready_timeout", "ready_timeout_ms")):
        if getattr(args, flag) is not None:
            body[key] = int(getattr(args, flag) * 1000)
    if args.instances is not None:
        body["num_instances"] = args.instances
    if args.latency_checks is not None:
        body["latency_checks"] = args.latency_checks
    if args.regions:
        body["regions"] = [r.strip() for r in args.regions.split(",") if r.strip()]
    if args.bake is not None:
        body["bake_ms"] = int(args.bake * 1000)
    if args.region_failure:
        body["region_failure"] = args.region_failure
    return _show(args, "POST", "/v1/rollouts", body=body)


def _show(args: argparse.Namespace, method: str, path: str, *, body: Any = None,
          params: dict[str, str] | None = None) -> int:
    try:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
        response = httpx.request(method, args.api.rstrip("/") + path, json=body, params=params,
                                 headers=headers, timeout=600)
    except httpx.HTTPError as exc:
        print(f"podium: cannot reach the control plane at {args.api} ({exc}); is `podium up` "
              "running?", file=sys.stderr)
        return 1
    failed = response.status_code >= 400
    code = (2 if response.status_code < 500 else 1) if failed else 0
    try:
        data = response.json()
    except ValueError:
        # a proxy's error page, an empty body: say what came back, never a traceback
        print(_not_json(method, path, response), file=sys.stderr if failed else sys.stdout)
        return code
    if failed:
        error = data.get("error", data) if isinstance(data, dict) else data
        message = error.get("message", error) if isinstance(error, dict) else error
        print(f"podium: {message}", file=sys.stderr)
        return code
    print(json.dumps(data, indent=2) if args.json else _human(path, data))
    return 0


def _not_json(method: str, path: str, response: httpx.Response) -> str:
    """An answer that is not JSON, shown as status + type + (the start of) its text."""
    text = response.text.strip()
    shown = (text[:500] + f"... ({len(text)} characters)") if len(text) > 500 else text
    kind = response.headers.get("content-type", "no content type")
    done = "" if response.status_code >= 400 else (
        "; the request was accepted: check it with `podium status` or `podium rollouts`")
    return (f"podium: {method} {path} answered {response.status_code} "
            f"{response.reason_phrase} with a non-JSON body ({kind}): {shown or '(empty)'}"
            f"{done}")


def _human(path: str, data: Any) -> str:
    if path == "/v1/events":
        return _events_table(data)
    if path == "/v1/packages" and "announced" in data:  # a Triton model's version folders
        versions = ", ".join(f"{data['name']}@{r['version']}" for r in data["announced"])
        skipped = f" (already announced: {', '.join(data['skipped'])})" if data["skipped"] else ""
        return f"announced {versions} from Triton model {data['triton_model']}{skipped}"
    if path == "/v1/status":
        lines = []
        models = data["models"]
        for model, entry in models.items():
            if entry.get("base") in models:
                continue  # shown under its base
            lines += _status_lines(model, entry)
            for adapter in entry.get("adapters", []):
                lines += _status_lines(adapter, models[adapter], indent="  ")
        for r in data["rollouts"]:
            lines.append(_rollout_line(r))
        return "\n".join(lines) or "nothing deployed"
    if path == "/v1/regions":
        return "\n".join(f"{r['position'] + 1}. {r['name']}" + (
            f"  runtime={r['runtime']}  http={r['http_port']}  grpc={r['grpc_port']}"
            if "runtime" in r else "") for r in data)
    if path == "/v1/gateways":
        return "\n".join(
            f"{g['id']}  pid={g['pid']}  http={g['http']}  "
            f"{'in sync' if g['in_sync'] else 'behind'} (generation {g['generation']})  "
            f"{'seen' if g['live'] else 'silent'} {g['seen_s_ago']} s ago" for g in data
        ) or "no gateway has reported"
    if isinstance(data, list):
        return "\n".join(_rollout_line(r) for r in data) or "no rollouts"
    if "to_version" in data:
        return _rollout_line(data)
    return json.dumps(data, indent=2)


def _status_lines(model: str, entry: dict[str, Any], indent: str = "") -> list[str]:
    """A model's lines of `podium status`; a LoRA adapter's, indented under its base, say
    where its versions are placed instead of instances of their own."""
    lines = []
    regions = entry.get("regions") or {"default": entry}
    kind = "LoRA adapter " if entry.get("base") else ""
    for region, part in regions.items():
        where = "" if list(regions) == ["default"] else f"  [{region}]"
        lines.append(f"{indent}{kind}{model}{where}  split={part['splits']}  "
                     f"aliases={part['aliases']}")
        for version, info in part["versions"].items():
            if entry.get("base"):
                placed = f"on {entry['base']}" if info["num_desired"] else "removed"
                lines.append(f"{indent}  @{version}  {info['strategy']:<10} {placed}")
                continue
            states = ",".join(i["state"] for i in info["instances"]) or "-"
            lines.append(f"{indent}  @{version}  {info['strategy']:<10} "
                         f"wanted={info['num_desired']}  instances={states}")
    return lines


def _rollout_line(r: dict[str, Any]) -> str:
    reason = f"  ({r['reason']})" if r.get("reason") else ""
    line = (f"#{r['id']} {r['model']} {r['from_version'] or '-'} -> {r['to_version']} "
            f"{r['strategy']} {r['status']} {r['phase']} {r['weight_new']}%{reason}")
    regions = r.get("regions") or []
    if len(regions) > 1:  # one line per region, in rollout order
        line += "".join(f"\n    {g['region']}: {g['status']} {g['phase']} stage {g['stage']} "
                        f"{g['weight_new']}%" for g in regions)
    return line


def _events_table(events: list[dict[str, Any]]) -> str:
    """Events as a table, newest first (the API's order)."""
    if not events:
        return "no events"
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in ("id", "time (UTC)", "kind", "model"):
        table.add_column(column, no_wrap=True)
    table.add_column("message", overflow="fold")
    for e in events:
        at = e["at"].replace("T", " ")[:19]
        table.add_row(str(e["id"]), at, e["kind"], e["model"] or "-", e["message"])
    console = Console(highlight=False)
    with console.capture() as captured:
        console.print(table)
    return captured.get().rstrip()
