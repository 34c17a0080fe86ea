"""A request the engine refuses for load inside vLLM's stream (it passed Podium's check, then
lost the race for the last place) logs one INFO line, no ERROR and no traceback, on the very
loggers vLLM's streaming generators write to; any other exception logged there keeps its ERROR
and its traceback (`backends.vllm.refusal_logs`)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator

import pytest
from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

from podium.backends.vllm import refusal_logs
from podium.backends.vllm.deadline_check import DeadlineRefused


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[Records]:
    refusal_logs.install()
    refusal_logs.install()  # twice: still one filter
    handler = Records()
    loggers = [logging.getLogger(name) for name in refusal_logs.STREAM_LOGGERS]
    for logger in loggers:
        assert logger.filters.count(refusal_logs._FILTER) == 1
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def test_the_filtered_loggers_are_vllms_stream_generators() -> None:
    """A vLLM upgrade that moves the generators fails here, not silently in production."""
    for module in ("vllm.entrypoints.openai.chat_completion.serving",
                   "vllm.entrypoints.openai.completion.serving"):
        assert importlib.import_module(module).logger.name in refusal_logs.STREAM_LOGGERS


@pytest.mark.parametrize("refusal", [QueueOverflowError(), MaxQueuedTokensError(),
                                     DeadlineRefused("the request cannot finish within its "
                                                     "deadline (1 s left)", 3.0)])
@pytest.mark.parametrize("name", refusal_logs.STREAM_LOGGERS)
def test_a_refusal_in_the_stream_is_one_info_line(records: Records, name: str,
                                                  refusal: Exception) -> None:
    logger = logging.getLogger(name)
    try:
        raise refusal
    except Exception:
        logger.exception("Error in chat completion stream generator.")
    (record,) = records.records
    assert record.levelno == logging.INFO and record.levelname == "INFO"
    assert record.exc_info is None and record.exc_text is None
    assert "refused for load" in record.getMessage()
    assert "Traceback" not in logging.Formatter().format(record)


@pytest.mark.parametrize("name", refusal_logs.STREAM_LOGGERS)
def test_a_real_error_keeps_its_error_and_traceback(records: Records, name: str) -> None:
    logger = logging.getLogger(name)
    try:
        raise RuntimeError("a real bug")
    except Exception:
        logger.exception("Error in completion stream generator.")
    (record,) = records.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "Traceback" in logging.Formatter().format(record)
    assert record.getMessage() == "Error in completion stream generator."
