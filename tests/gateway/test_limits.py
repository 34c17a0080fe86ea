"""The gateway's limits as `podium up` takes them: one flag each, defaults, bad values named."""

from __future__ import annotations

import pytest

from podium.cli import build_parser, main
from podium.gateway.limits import GatewayLimits, from_flags


def test_podium_up_flags_set_every_limit_and_default_to_the_documented_values() -> None:
    assert from_flags(build_parser().parse_args(["up"])) == GatewayLimits()
    assert GatewayLimits().model_dump() == {
        "max_body_bytes": 16 << 20, "max_header_bytes": 64 << 10,
        "max_grpc_message_bytes": 256 << 20, "body_timeout_s": 60.0,
        "max_in_flight_per_instance": 256}
    args = build_parser().parse_args([
        "up", "--max-body-bytes", "2048", "--max-header-bytes", "4096",
        "--max-grpc-message-bytes", "8192", "--body-timeout", "1.5",
        "--max-in-flight-per-instance", "8"])
    assert from_flags(args) == GatewayLimits(max_body_bytes=2048, max_header_bytes=4096,
                                             max_grpc_message_bytes=8192, body_timeout_s=1.5,
                                             max_in_flight_per_instance=8)


@pytest.mark.parametrize("flag, value, says", [
    ("--max-body-bytes", "10", "--max-body-bytes=10: input should be greater than or equal to "
                               "1024"),
    ("--max-header-bytes", "0", "--max-header-bytes=0: input should be greater than or equal "
                                "to 1024"),
    ("--body-timeout", "0", "--body-timeout=0.0: input should be greater than 0"),
    ("--max-in-flight-per-instance", "0", "--max-in-flight-per-instance=0: input should be "
                                          "greater than or equal to 1"),
], ids=["body-too-small", "header-zero", "timeout-zero", "in-flight-zero"])
def test_a_bad_limit_stops_podium_up_before_it_starts_naming_the_flag(
        capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str) -> None:
    assert main(["up", flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"podium: error: {says}"
