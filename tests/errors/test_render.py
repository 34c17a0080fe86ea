"""Every class of the hierarchy, rendered by every protocol: status, gRPC code and body."""

from __future__ import annotations

import json
import logging

import pytest

from podium import errors
from podium.errors.render import (
    control_body,
    grpc_status,
    json_error,
    kind_of,
    kserve_body,
    openai_body,
    problem_of,
)

# class, HTTP status, gRPC code, OpenAI type
TABLE = [
    pytest.param(errors.InvalidArgument, 400, "INVALID_ARGUMENT", "invalid_request_error",
                 id="invalid-argument"),
    pytest.param(errors.Unauthorized, 401, "UNAUTHENTICATED", "authentication_error",
                 id="unauthorized"),
    pytest.param(errors.NotFound, 404, "NOT_FOUND", "not_found_error", id="not-found"),
    pytest.param(errors.MethodNotAllowed, 405, "UNIMPLEMENTED", "invalid_request_error",
                 id="method-not-allowed"),
    pytest.param(errors.Conflict, 409, "ALREADY_EXISTS", "conflict_error", id="conflict"),
    pytest.param(errors.PayloadTooLarge, 413, "RESOURCE_EXHAUSTED", "invalid_request_error",
                 id="payload-too-large"),
    pytest.param(errors.HeaderFieldsTooLarge, 431, "RESOURCE_EXHAUSTED", "invalid_request_error",
                 id="header-fields-too-large"),
    pytest.param(errors.RequestTimeout, 408, "DEADLINE_EXCEEDED", "invalid_request_error",
                 id="request-timeout"),
    pytest.param(errors.RequestError, 400, "INVALID_ARGUMENT", "invalid_request_error",
                 id="request-error"),
    pytest.param(errors.Overloaded, 429, "RESOURCE_EXHAUSTED", "rate_limit_error",
                 id="overloaded"),
    pytest.param(errors.DeadlineExceeded, 504, "DEADLINE_EXCEEDED", "timeout_error",
                 id="deadline-exceeded"),
    pytest.param(errors.Unavailable, 503, "UNAVAILABLE", "service_unavailable",
                 id="unavailable"),
    pytest.param(errors.UpstreamFailed, 502, "UNAVAILABLE", "service_unavailable",
                 id="upstream-failed"),
    pytest.param(errors.ColdStart, 503, "UNAVAILABLE", "service_unavailable",
                 id="cold-start"),
    pytest.param(errors.PackageError, 400, "INVALID_ARGUMENT", "invalid_request_error",
                 id="package-error"),
    pytest.param(errors.UnsafeArchive, 400, "INVALID_ARGUMENT", "invalid_request_error",
                 id="unsafe-archive"),
    pytest.param(errors.EngineVersionMismatch, 400, "INVALID_ARGUMENT", "invalid_request_error",
                 id="engine-version-mismatch"),
    pytest.param(errors.BootError, 500, "INTERNAL", "internal_error", id="boot-error"),
    pytest.param(errors.BackendError, 500, "INTERNAL", "internal_error", id="backend-error"),
    pytest.param(errors.BackendDead, 503, "UNAVAILABLE", "service_unavailable",
                 id="backend-dead"),
    pytest.param(errors.PodiumError, 500, "INTERNAL", "internal_error", id="podium-error"),
]


@pytest.mark.parametrize(("cls", "status", "code", "kind"), TABLE)
def test_each_protocol_renders_each_class(cls: type[errors.PodiumError], status: int, code: str,
                                          kind: str) -> None:
    problem = problem_of(cls("model 'm' is not ready", param="model"))
    assert openai_body(problem) == {"error": {"message": "model 'm' is not ready", "type": kind,
                                              "param": "model", "code": status}}
    assert kserve_body(problem) == {"error": "model 'm' is not ready"}
    assert control_body(problem) == openai_body(problem)
    assert grpc_status(problem) == (code, "model 'm' is not ready")
    assert json_error("kserve", cls("x"))[0] == status


def test_every_class_of_the_hierarchy_is_in_the_table() -> None:
    def subclasses(cls: type) -> set[type]:  # those drawn in podium.errors, not elsewhere
        return ({cls} if cls.__module__ == "podium.errors" else set()) | {
            s for sub in cls.__subclasses__() for s in subclasses(sub)}

    tabled = {param.values[0] for param in TABLE}
    assert subclasses(errors.PodiumError) == tabled


def test_a_subclass_without_its_own_row_takes_its_nearest_parents() -> None:
    class ModelGone(errors.NotFound):
        pass

    class WeightsMissing(errors.BackendDead):
        pass

    assert kind_of(ModelGone("x")).http_status == 404
    assert kind_of(WeightsMissing("x")).grpc_code == "UNAVAILABLE"


@pytest.mark.parametrize("exc", [RuntimeError("token=s3cr3t in /home/me/key"),
                                 KeyError("s3cr3t"), ZeroDivisionError("s3cr3t")],
                         ids=["runtime-error", "key-error", "zero-division"])
def test_an_unexpected_exception_names_a_request_id_never_its_text(
        exc: Exception, caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise exc
    except Exception:  # a real traceback, as a handler would see it
        with caplog.at_level(logging.ERROR, logger="podium.errors"):
            status, body = json_error("openai", exc, "req-42")
    error = json.loads(body)["error"]
    assert (status, error["type"], error["code"]) == (500, "internal_error", 500)
    assert "req-42" in error["message"] and "s3cr3t" not in error["message"]
    [record] = caplog.records
    assert "req-42" in record.getMessage() and record.exc_info[1] is exc


def test_without_an_id_a_fresh_one_is_made_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="podium.errors"):
        message = problem_of(ValueError("boom")).message
    request_id = message.split("request id ")[1].split(")")[0]
    assert len(request_id) == 32 and request_id in caplog.records[0].getMessage()


@pytest.mark.parametrize(("seconds", "header"), [(0.2, "1"), (1.0, "1"), (2.5, "3")])
def test_an_overload_answer_says_when_to_come_back(seconds: float, header: str) -> None:
    from podium.errors.http import error_response
    from podium.errors.render import retry_after

    response = error_response("kserve", errors.Overloaded("queue full", retry_after_s=seconds))
    assert response.status_code == 429
    assert response.headers["Retry-After"] == header
    assert retry_after(errors.InvalidArgument("x")) is None
    assert "Retry-After" not in error_response("kserve", errors.InvalidArgument("x")).headers
