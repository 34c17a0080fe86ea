"""Logging set-up for an instance: readable text, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {"ts": round(time.time(), 3), "level": record.levelname.lower(),
                "logger": record.name, "message": record.getMessage()}
        extra = getattr(record, "podium", None)
        if isinstance(extra, dict):
            data.update(extra)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(log_format: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s", "%H:%M:%S"))
    root = logging.getLogger("podium")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
