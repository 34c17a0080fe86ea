"""A request refused for load inside vLLM's stream is a normal path: one INFO line, no ERROR.

Podium checks the engine's room before a request is rendered (`checks.check_room`, and from the
request's head, `server.early_shed`), but between that check and the engine's own one in
`AsyncLLM.generate` the request's prompt is rendered (awaits), and in a burst another request
can take the last place. vLLM's streaming generators (chat and completions) catch the engine's
refusal there like any failure: `logger.exception("Error in ... stream generator.")`, an ERROR
with a traceback, then an error event that Podium answers as the 429 it is
(`checks.admission_response`). About three per run of `bench/overload.py`, each firing an
operator's alert on a healthy instance.

`install()` puts a filter on those two loggers that rewrites exactly those records (their
exception is an admission refusal: `checks.admission_refusal`, the queue bounds or a deadline
the engine cannot meet) into one INFO line without the traceback. Any other exception logged
there keeps its ERROR and traceback.
"""

from __future__ import annotations

import logging

STREAM_LOGGERS = ("vllm.entrypoints.openai.chat_completion.serving",
                  "vllm.entrypoints.openai.completion.serving")
"""The loggers of vLLM's streaming generators (`chat_completion_stream_generator`,
`completion_stream_generator`), which log every exception of the engine's stream at ERROR."""


class RefusalsAreInfo(logging.Filter):
    """An admission refusal logged with its traceback becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or record.levelno < logging.ERROR:
            return True
        from podium.backends.vllm.checks import admission_refusal

        refusal = admission_refusal(exc)
        if refusal is None:
            return True  # a real error: as vLLM logged it
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        record.msg = ("a request was refused for load by the engine's own admission check "
                      "after it passed Podium's (answered 429 with Retry-After): %s")
        record.args = (refusal.message,)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


_FILTER = RefusalsAreInfo()


def install() -> None:
    """Put the filter on vLLM's streaming loggers (once, however often it is called)."""
    for name in STREAM_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
