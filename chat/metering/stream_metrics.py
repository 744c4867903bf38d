"""A metered stream's metrics (chat/runtime/metrics.py): counted once at its start and once at its end."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from chat.runtime import metrics

PATHS = {"chat": "chat", "api": "api", "titl": "title"}

# usage row pk -> (path, provider, prompt tokens): the streams this process started and has not ended.
_running: dict[int, tuple[str, str, int]] = {}


def path_of(source: str) -> str:
    return PATHS.get(source, source)


def opened(pk: int, source: str, provider: str, prompt_tokens: int) -> None:
    """Counted once the start's transaction commits: a start rolled back never ran."""

    def count() -> None:
        path = path_of(source)
        _running[pk] = (path, provider, prompt_tokens)
        metrics.streams_started.labels(path, provider).inc()
        metrics.streams_running.labels(path).inc()

    transaction.on_commit(count)


def refused(source: str) -> None:
    metrics.budget_refusals.labels(path_of(source)).inc()


def settled(pk: int, fields: dict[str, Any]) -> None:
    """Counted once the settle commits; a row of another (dead) process is not this process's to count."""

    def count() -> None:
        started = _running.pop(pk, None)
        if started is None:
            return
        path, provider, prompt_tokens = started
        metrics.streams_running.labels(path).dec()
        metrics.streams_ended.labels(path, provider, fields.get("status", "")).inc()
        if fields.get("ttft_ms") is not None:
            metrics.first_token_seconds.labels(path).observe(fields["ttft_ms"] / 1000)
        if fields.get("duration_ms") is not None:
            metrics.stream_seconds.labels(path).observe(fields["duration_ms"] / 1000)
        metrics.tokens.labels(path, provider, "prompt").inc(fields.get("prompt_tokens") or prompt_tokens)
        metrics.tokens.labels(path, provider, "completion").inc(fields.get("completion_tokens") or 0)
        if fields.get("cost"):
            metrics.cost_usd.labels(path, provider).inc(float(fields["cost"]))

    transaction.on_commit(count)


def running() -> int:
    """Streams this process started and has not ended (for tests and the shutdown's log)."""
    return len(_running)
