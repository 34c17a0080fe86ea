"""The KServe limits on their own: inflation capped while it streams, safe JSON, and compressed
requests that are within the limits served as if sent plain."""

from __future__ import annotations

import gzip
import json
import zlib

import httpx
import pytest

from podium.errors import InvalidArgument, PayloadTooLarge
from podium.examples.builders import synthetic_features
from podium.frontends.kserve_limits import KServeLimits, inflate
from podium.frontends.safe_json import loads_object, loads_value
from tests.support.kserve_instance import Instance
from tests.support.polling import eventually

BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                               "data": synthetic_features(1, seed=1).ravel().tolist()}]}).encode()


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(("encoding", "packed"), [
    ("gzip", gzip.compress(BODY)), ("deflate", zlib.compress(BODY)),
    ("deflate", _raw_deflate(BODY))], ids=["gzip", "deflate-zlib", "deflate-raw"])
def test_compressed_infer_is_served(kserve_instance: Instance, encoding: str,
                                    packed: bytes) -> None:
    reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/xgb-example/infer",
                       content=packed, headers={"Content-Encoding": encoding})
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["shape"] == [1, 1]


def test_inflate_stops_at_the_cap() -> None:
    data = b"x" * 100_000
    assert inflate(gzip.compress(data), "gzip", 100_000) == data
    with pytest.raises(PayloadTooLarge, match="--max-inflated-bytes"):
        inflate(gzip.compress(data), "gzip", 99_999)
    with pytest.raises(PayloadTooLarge, match="past the 1048576-byte limit"):
        inflate(gzip.compress(b"\0" * (64 << 20)), "gzip", 1 << 20)  # a 64 MiB bomb


@pytest.mark.parametrize("packed", [gzip.compress(b"hello")[:-6], gzip.compress(b"a") + b"zz",
                                    b"not gzip at all"], ids=["truncated", "trailing", "junk"])
def test_inflate_rejects_broken_streams(packed: bytes) -> None:
    with pytest.raises(InvalidArgument, match="not valid gzip"):
        inflate(packed, "gzip", 1 << 20)


def test_limits_are_validated_on_construction() -> None:
    with pytest.raises(ValueError, match="max_json_depth"):
        KServeLimits(max_json_depth=1)
    with pytest.raises(ValueError, match="max_elements"):
        KServeLimits(max_elements=0)


@pytest.mark.parametrize(("raw", "words"), [
    (b"[" * 100_000, "deeper than the 8-level limit"),
    (b'{"a": [[[[[[[[1]]]]]]]]}', "body.a[0][0][0][0][0][0][0] (depth 9)"),
    (b'{"a": {"\\udfff": 1}}', "lone UTF-16 surrogate (\\udfff)"),
    (b'{"a": ["ok", "\\ud83d"]}', "body.a[1]"),
    (b"[1]", "must be a JSON object, got an array"),
], ids=["100k-deep", "past-depth", "surrogate-key", "high-surrogate-alone", "not-an-object"])
def test_loads_object_refuses(raw: bytes, words: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        loads_object(raw, max_depth=8)
    assert words in err.value.message


def test_loads_keeps_valid_text_and_depth() -> None:
    assert loads_object(b'{"a": "\\ud83d\\ude00", "b": [[[1]]]}', max_depth=4) == {
        "a": "\U0001F600", "b": [[[1]]]}
    assert loads_value("[[1]]", field="x", max_depth=2) == [[1]]
    with pytest.raises(InvalidArgument, match=r"JSON at x\[0\]\[0\] \(depth 3\) nests deeper "
                       "than the 2-level limit$"):
        loads_value("[[[1]]]", field="x", max_depth=2)


def test_serve_flags_reach_both_frontends(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """`podium serve --max-…` sets the limits the KServe frontends get; unset flags keep the
    documented defaults."""
    from podium import cli
    from podium.server import serve

    seen = []
    monkeypatch.setattr(serve, "run_server", lambda config: seen.append(config) or 0)
    args = cli.build_parser().parse_args([
        "serve", "--repository", str(tmp_path), "--max-elements", "5", "--max-json-depth", "9",
        "--grpc-max-message-bytes", "4096", "--max-header-bytes", "2048"])
    assert args.func(args) == 0
    limits = seen[0].kserve_limits
    assert (limits.max_elements, limits.max_json_depth, limits.grpc_max_message_bytes) == (
        5, 9, 4096)
    assert seen[0].max_header_bytes == 2048
    defaults = KServeLimits()
    assert (limits.max_tensors, limits.max_inflated_bytes, limits.max_body_bytes) == (
        defaults.max_tensors, defaults.max_inflated_bytes, defaults.max_body_bytes)
    assert (defaults.max_body_bytes, defaults.max_inflated_bytes, defaults.max_json_depth,
            defaults.max_tensors, defaults.max_elements, defaults.grpc_max_message_bytes) == (
        16 << 20, 32 << 20, 64, 64, 16 << 20, 64 << 20)  # as docs/operations.md says


@pytest.mark.parametrize(("path", "body"), [
    ("generate", {"text_input": "Capital?", "id": "gone-generate"}),
    ("infer", {"id": "gone-infer", "inputs": [{"name": "text_input", "datatype": "BYTES",
                                               "shape": [1], "data": ["Capital?"]}]}),
])
def test_a_client_that_leaves_cancels_its_generation(kserve_instance: Instance, path: str,
                                                     body: dict) -> None:
    """The engine request is aborted when the HTTP client disconnects, not run to the end."""

    engine = kserve_instance.llm.engine
    engine.word_delay_s = 2.0  # five words: ten seconds unless cancelled
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://{kserve_instance.http_url}/v2/models/fake-llm/{path}", json=body,
                       timeout=0.5)
        assert eventually(lambda: body["id"] in engine.aborted, 10)
    finally:
        engine.word_delay_s = 0.0
    reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/fake-llm/generate",
                       json={"text_input": "Capital?", "parameters": {"max_tokens": 2}})
    assert reply.status_code == 200, reply.text
