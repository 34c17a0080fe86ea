"""A steady trickle of KServe requests to a gateway, for the console's live figures."""

from __future__ import annotations

import threading

import httpx

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


class Trickle:
    """One client thread sending `model` a request every `interval_s` until stopped."""

    def __init__(self, url: str, model: str, *, key: str | None = None,
                 interval_s: float = 0.03) -> None:
        self.url = f"{url}/v2/models/{model}/infer"
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.interval_s = interval_s
        self.stopped = threading.Event()
        self.statuses: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=15)

    def _run(self) -> None:
        with httpx.Client(timeout=10, headers=self.headers) as client:
            while not self.stopped.wait(self.interval_s):
                try:
                    self.statuses.append(client.post(self.url, json=BODY).status_code)
                except httpx.HTTPError:
                    self.statuses.append(0)
