"""Log lines an operator can read: each with the request it belongs to, in plain text or JSON (LOG_FORMAT).

`request_id` is a context variable the server sets for each request and websocket
(chatsite/server.py): nginx's X-Request-ID when a trusted proxy sent one, else a new short id.
Every line logged while the request runs, in its tasks too (they copy the context), carries it.
"""

from __future__ import annotations

import contextvars
import logging
import time

import orjson

from chat.lib.log_paths import loggable_path

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (a handler's filter: records of every logger pass it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get()
        return True


class SecretPathFilter(logging.Filter):
    """Shows the paths that carry a capability (an invite, a password reset, a share) without it, whichever
    logger names them (the access log, django.request's "Not Found: <path>"): a handler's filter."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(arg, str) and arg.startswith("/") for arg in record.args):
            record.args = tuple(loggable_path(arg) if isinstance(arg, str) else arg for arg in record.args)
        return True


class SuspiciousRequestFilter(logging.Filter):
    """Django's security warnings (a Host not in ALLOWED_HOSTS, a bad signature) as one line, without the traceback
    Django attaches: the request was bad, not the code, and scanners send such requests all day (a handler's filter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("django.security."):
            record.exc_info, record.exc_text = None, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC), level, logger, message, request_id, and the traceback if any."""

    converter = time.gmtime

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        for key in ("client", "method", "path", "status", "size", "ms"):
            if hasattr(record, key):
                line[key] = getattr(record, key)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()
