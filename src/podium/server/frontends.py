"""Which frontends an instance runs, and how they are mounted on its HTTP app.

    embedded (the default)  OpenAI /v1 + KServe v2 over HTTP and gRPC
    standalone              KServe v2 over HTTP and gRPC only: the OpenAI router
                            (`podium.frontends.openai`) and vLLM's serving classes are never
                            imported or built, and every /v1 path answers 404 naming the mode

The packages choose (their manifests' `frontends`): an instance runs standalone when every
package it boots with is standalone, embedded otherwise (a standalone package on an embedded
instance is served over KServe only). `podium serve` opens its HTTP port before boot has read
the packages, so until boot's `mount frontends` step /v1 answers 503 like every inference route.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from starlette.routing import BaseRoute

from podium.errors import NotFound, Unavailable
from podium.errors.render import OPENAI_OUTSIDE_V1
from podium.package.manifest import FRONTEND_MODES

EMBEDDED, STANDALONE = FRONTEND_MODES
_OPENAI_MODULE = "podium.frontends.openai"
_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


def mode_of(modes: Iterable[str]) -> str:
    """The instance's mode from its packages' `frontends`: standalone only if all are."""
    modes = list(modes)
    return STANDALONE if modes and all(m == STANDALONE for m in modes) else EMBEDDED


def describe(mode: str) -> str:
    """One line for the boot log."""
    if mode == STANDALONE:
        return "standalone: KServe v2 over HTTP and gRPC; no OpenAI layer"
    return "embedded: OpenAI /v1 + KServe v2 over HTTP and gRPC"


class Frontends:
    """The /v1 side of one instance's app: the OpenAI router, or a route refusing /v1."""

    def __init__(self, app: FastAPI, instance: Any) -> None:
        self.app = app
        self.instance = instance
        self._gate: list[BaseRoute] = []

    def mount(self, mode: str | None) -> None:
        """Mount `mode`'s routes now (None: not known yet, /v1 answers 503 until `settle`)."""
        self.instance.frontends = mode
        if mode == EMBEDDED:
            self._mount_openai()
        else:
            self._mount_gate()

    async def settle(self, mode: str) -> None:
        """Boot read the packages: mount the mode's routes in place of the waiting gate."""
        if mode == EMBEDDED:  # the import off the event loop: liveness keeps answering
            await asyncio.to_thread(importlib.import_module, _OPENAI_MODULE)
            for route in self._gate:
                self.app.router.routes.remove(route)
            self._gate = []
        self.mount(mode)

    def _mount_openai(self) -> None:
        openai = importlib.import_module(_OPENAI_MODULE)
        self.app.include_router(openai.create_router(
            self.instance.repository, limits=self.instance.config.body_limits()))

    def _mount_gate(self) -> None:
        if self._gate:
            return
        before = len(self.app.router.routes)
        for path in ("/v1", "/v1/{path:path}", *OPENAI_OUTSIDE_V1):
            self.app.add_api_route(path, self._refuse, methods=_METHODS,
                                   include_in_schema=False)
        self._gate = self.app.router.routes[before:]

    async def _refuse(self, request: Request) -> None:
        if self.instance.frontends is None:
            raise Unavailable("the instance is starting: the OpenAI API (/v1) answers once "
                              "it is ready; poll /health/ready")
        raise NotFound(standalone_refusal(request.url.path, self._models()), param="path")

    def _models(self) -> list[str]:
        return sorted({p.manifest.name for p in self.instance.repository.packages.values()})


def standalone_refusal(path: str, models: list[str], *, what: str = "this instance") -> str:
    """Why a standalone deployment answers no OpenAI request, and where to go instead."""
    model = models[0] if len(models) == 1 else "{model}"
    return (f"{what} runs standalone (its package sets \"frontends\": \"standalone\"): it "
            f"serves KServe v2 only, over HTTP (POST /v2/models/{model}/generate or /infer) "
            f"and gRPC, not the OpenAI API ({path}); package the model with \"frontends\": "
            "\"embedded\" to serve /v1")
