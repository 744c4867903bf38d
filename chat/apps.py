import asyncio
import logging
import sys

from django.apps import AppConfig
from django.db import DatabaseError

log = logging.getLogger(__name__)


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        from .sessions import connect_signals

        connect_signals()


def prepare_to_serve() -> None:
    """Once per server process, before it serves: sync the configured provider, recover dead streams."""
    from django.conf import settings

    from .generation import lease
    from .models import Message, Provider

    end_streams_at_shutdown()
    try:
        provider = Provider.objects.sync_from_settings()
        # One process alone owns every stream; beside others, only those whose lease expired are dead.
        stale_after = lease() if settings.REDIS_URL else None
        recovered = Message.objects.recover_orphans(stale_after)
    except DatabaseError as exc:
        log.error("database not ready (%s); run `manage.py migrate`", exc)
        return
    if recovered:
        log.warning("marked %d stream(s) left by a stopped server as interrupted", len(recovered))
    if provider is not None and provider.is_demo:
        log.warning(
            "No UPSTREAM_BASE_URL set: chatting against the built-in demo upstream (provider 'demo', %s). "
            "Set UPSTREAM_BASE_URL and UPSTREAM_API_KEY for a real one.",
            provider.base_url,
        )


def end_streams_at_shutdown() -> None:
    """Under daphne, before the reactor stops: end running streams as interrupted, close the upstream client.

    Their text and usage are saved now instead of waiting for the next start-up to
    find them still `streaming`, and the shared client's connections close cleanly.
    """
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None:  # not under daphne (tests, management commands)
        return
    from twisted.internet import defer

    from . import generation, upstream

    async def shutdown() -> None:
        for task in list(generation._tasks):
            task.cancel()
        await generation.wait_all()
        await upstream.close_shared_client()

    def trigger():
        return defer.Deferred.fromFuture(asyncio.ensure_future(shutdown()))

    reactor.addSystemEventTrigger("before", "shutdown", trigger)
