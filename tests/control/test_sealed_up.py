"""A sealed data plane on a real `podium up` (local runtime, xgb-example): its instances take
only the control plane's credential, which lives in a 0600 file and in no log; the gateway and
the API take their own keys per role, rotated without a restart."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from podium import credential
from tests.support.up_process import Up, wait

INFER_KEY, ADMIN_KEY, NEW_ADMIN_KEY = "infer-key-0123", "admin-key-0123", "admin-key-4567"
BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                    "data": [0.5] * 20}]}
INFER_PATH = "/v2/models/xgb-example/infer"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _grpc_infer(target: str, key: str | None) -> str:
    client = grpcclient.InferenceServerClient(target)
    features = grpcclient.InferInput("features", [1, 20], "FP32")
    features.set_data_from_numpy(np.full((1, 20), 0.5, dtype=np.float32))
    headers = {"authorization": f"Bearer {key}"} if key else None
    try:
        return client.infer("xgb-example", [features], headers=headers
                            ).get_response().model_version
    finally:
        client.close()


def test_instances_take_only_the_planes_credential_and_the_gateway_its_own_keys(
        up: Up, examples_dir: Path, tmp_path: Path) -> None:
    admin_keys = tmp_path / "admin.keys"
    admin_keys.write_text(f"{ADMIN_KEY}\n")
    up.args = ("--api-key", INFER_KEY, "--admin-key-file", str(admin_keys))
    up.start()
    api = httpx.Client(base_url=up.api, headers=_bearer(ADMIN_KEY), timeout=30)
    assert api.post("/v1/packages", json={"path": str(examples_dir / "xgb-example")}
                    ).status_code == 201
    assert api.post("/v1/rollouts", json={
        "model": "xgb-example", "version": "1", "stages": [100], "analysis_window_ms": 0,
        "warm_delay_ms": 0}).status_code == 201
    wait(lambda: api.get("/v1/rollouts/1").json()["status"] == "succeeded", what="deployed")

    def ready() -> list[dict]:
        versions = api.get("/v1/status").json()["models"]["xgb-example"]["versions"]
        return [i for i in versions["1"]["instances"] if i["state"] == "ready"]

    wait(lambda: len(ready()) == 1, what="the instance ready")
    [instance] = ready()
    direct = f"http://127.0.0.1:{instance['http_port']}"

    # the gateway path works with an inference key, over HTTP and gRPC
    r = httpx.post(up.gateway + INFER_PATH, json=BODY, headers=_bearer(INFER_KEY), timeout=10)
    assert (r.status_code, r.json()["model_version"]) == (200, "1"), r.text
    assert _grpc_infer(f"127.0.0.1:{up.grpc_port}", INFER_KEY) == "1"
    # each key only for its role: no inference with the admin key, no administration with
    # the inference key (control API and the gateway's /metrics)
    assert httpx.post(up.gateway + INFER_PATH, json=BODY, headers=_bearer(ADMIN_KEY),
                      timeout=10).status_code == 401
    assert httpx.get(up.api + "/v1/status", headers=_bearer(INFER_KEY),
                     timeout=10).status_code == 401
    assert httpx.get(up.gateway + "/metrics", headers=_bearer(INFER_KEY),
                     timeout=10).status_code == 401
    assert httpx.get(up.gateway + "/metrics", headers=_bearer(ADMIN_KEY),
                     timeout=10).status_code == 200

    # the instance called directly: no key the operator holds opens it, liveness stays open
    for headers in ({}, _bearer(INFER_KEY), _bearer(ADMIN_KEY)):
        r = httpx.post(direct + INFER_PATH, json=BODY, headers=headers, timeout=10)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "API key" in r.json()["error"]  # the KServe error shape
        r = httpx.post(direct + "/v2/repository/models/xgb-example/unload", json={},
                       headers=headers, timeout=10)
        assert r.status_code == 401
    assert httpx.get(direct + "/v2/health/live", timeout=10).status_code == 200
    with pytest.raises(grpcclient.InferenceServerException) as err:
        _grpc_infer(f"127.0.0.1:{instance['grpc_port']}", INFER_KEY)
    assert err.value.status() == "StatusCode.UNAUTHENTICATED"

    # the credential: one file, 0600, and it is what the instance takes
    path = credential.path_in(up.home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    r = httpx.post(direct + INFER_PATH, json=BODY, headers=_bearer(secret), timeout=10)
    assert r.status_code == 200  # and the refused unloads above changed nothing
    assert _grpc_infer(f"127.0.0.1:{instance['grpc_port']}", secret) == "1"
    # never logged, never on a command line
    logs = [p for p in up.home.rglob("*.log") if p.is_file()]
    assert len(logs) >= 2  # podium up's own and the instance's
    assert not [p for p in logs if secret in p.read_text(errors="replace")]
    assert secret.encode() not in Path(f"/proc/{instance['pid']}/cmdline").read_bytes()

    # admin keys rotated without a restart: a new file renamed over the old one
    new = admin_keys.with_suffix(".new")
    new.write_text(f"{NEW_ADMIN_KEY}\n")
    os.replace(new, admin_keys)
    assert api.get("/v1/status").status_code == 401
    assert httpx.get(up.api + "/v1/status", headers=_bearer(NEW_ADMIN_KEY),
                     timeout=10).status_code == 200
    # the data plane never noticed
    r = httpx.post(up.gateway + INFER_PATH, json=BODY, headers=_bearer(INFER_KEY), timeout=10)
    assert r.status_code == 200


@pytest.mark.parametrize(("keys", "message"), [
    ({"api_key_files": ("missing.keys",)}, "--api-key-file 'missing.keys' is not a file"),
    ({"admin_key_files": ("missing.keys",)}, "--admin-key-file 'missing.keys' is not a file"),
    ({"api_keys": ("",)}, "an empty --api-key"),
], ids=["api-key-file", "admin-key-file", "empty-key"])
def test_up_refuses_bad_key_settings_naming_the_flag(tmp_path: Path, keys: dict,
                                                     message: str) -> None:
    from podium.auth_keys import KeyConfig
    from podium.control.up import UpConfig
    from podium.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=message):
        UpConfig(home=tmp_path, keys=KeyConfig(**keys))
    assert UpConfig(home=tmp_path, keys=KeyConfig(api_keys=("good",))).access().guarded
