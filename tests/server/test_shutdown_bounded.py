"""`podium serve --shutdown-timeout N` is gone within N seconds of SIGTERM, whatever a model
is doing: a hung `initialize` or `execute` gets the process tree killed and exit 124, saying so;
an idle instance still exits 0 at once."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from podium.shutdown import EXIT_TIMED_OUT
from tests.support.harness import start_instance

TIMEOUT_S = 5  # an idle instance stops well inside it, also on a loaded CI machine
SLACK_S = 4.0  # process exit and a loaded test machine

MODEL = '''
import pathlib, subprocess, sys, time
import numpy as np


class Model:
    def initialize(self, config):
        here = pathlib.Path(config["model_repository"])
        # a helper process, as an engine has: the timed-out stop must take it down too
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (here / "helper.pid").write_text(str(helper.pid))
        print("initialize started", flush=True)
        if config["parameters"]["hang"] == "initialize":
            time.sleep(3600)

    def execute(self, requests):
        if self.hang_execute:
            print("execute started", flush=True)
            time.sleep(3600)
        return [{"y": r["x"]} for r in requests]

    @property
    def hang_execute(self):
        return self._hang == "execute"

    def finalize(self):
        pass
'''


def _package(root: Path, hang: str) -> Path:
    root.mkdir()
    (root / "model.py").write_text(MODEL.replace("self._hang", repr(hang)))
    (root / "podium.json").write_text(json.dumps({
        "name": "hang", "version": "1", "backend": "python", "module": "model.py",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
        "parameters": {"hang": hang}}))
    return root


def _wait_log(instance, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in instance.log():
        assert instance.process.poll() is None, instance.log()[-3000:]
        assert time.monotonic() < deadline, f"never logged {text!r}:\n{instance.log()[-3000:]}"
        time.sleep(0.1)


def _infer(url: str, results: list[object]) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    try:
        results.append(httpx.post(f"{url}/v2/models/hang/infer", json=body, timeout=60))
    except httpx.HTTPError as exc:  # the connection ends with the process
        results.append(exc)


@pytest.mark.parametrize("hang", ["initialize", "execute", "nothing"])
def test_sigterm_ends_serve_within_its_shutdown_timeout(tmp_path: Path, hang: str) -> None:
    package = _package(tmp_path / "pkg", hang)
    instance = start_instance([str(package), "--shutdown-timeout", str(TIMEOUT_S)],
                              tmp_path / "serve.log")
    results: list[object] = []
    try:
        _wait_log(instance, "initialize started")
        helper = psutil.Process(int((package / "helper.pid").read_text()))
        if hang != "initialize":
            instance.wait_ready(60)
            client = threading.Thread(target=_infer, args=(instance.http_url, results))
            client.start()
            if hang == "execute":
                _wait_log(instance, "execute started")
            else:
                client.join(30)
                assert [getattr(r, "status_code", r) for r in results] == [200]
        sent = time.monotonic()
        instance.process.send_signal(signal.SIGTERM)
        code = instance.process.wait(TIMEOUT_S + SLACK_S + 10)
        took = time.monotonic() - sent
        psutil.wait_procs([helper], timeout=5)
        helper_left = helper.is_running() and helper.status() != psutil.STATUS_ZOMBIE
    finally:
        instance.stop(10)
        if (package / "helper.pid").exists():
            with contextlib.suppress(psutil.Error):  # a clean stop leaves it to the model
                psutil.Process(int((package / "helper.pid").read_text())).kill()
    log = instance.log()
    if hang == "nothing":
        assert code == 0 and "stopped" in log and "timed out" not in log
        assert took < SLACK_S
        return
    assert code == EXIT_TIMED_OUT, log[-3000:]
    assert TIMEOUT_S - 0.5 <= took <= TIMEOUT_S + SLACK_S, took
    assert f"podium serve: shutdown timed out after {TIMEOUT_S} s; killed 1 process" in log
    assert f"in {hang}" in log  # the stack dump shows where it hung
    assert not helper_left, "the model's helper process outlived the timed-out stop"
