import logging

from django.apps import AppConfig
from django.db import DatabaseError

log = logging.getLogger(__name__)


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from .rollup import install_if_missing
        from .sessions import connect_signals

        connect_signals()
        post_migrate.connect(install_if_missing, sender=self)


def prepare_to_serve() -> None:
    """Once per server process, before it serves: sync the configured provider, recover dead streams."""
    from django.conf import settings

    from .models import Message, Provider
    from .process import lease

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


async def start_serving() -> None:
    """Start this process's lease, control listener and sweeps (chat/process.py); chatsite.server calls it at start-up.

    Otherwise a process starts them with its first socket or `/v1` request (daphne has no
    lifespan start-up), and one that has served neither would not sweep a dead peer's streams.
    """
    from . import process

    await process.ensure_started()


def running_streams() -> list:
    """The chat generations of this process still streaming (asyncio tasks; a graceful shutdown waits for them)."""
    from . import generation

    return generation.running()


async def end_streams(reason: str) -> None:
    """End every stream of this process now: `/v1` ones get an error event and [DONE], chats are interrupted.

    Their text and usage are saved now instead of waiting for the next start-up to find
    them still `streaming`; called by chatsite.server once the shutdown grace is over.
    """
    from . import generation, relay

    relay.running.interrupt(reason)
    await generation.shutdown()


async def close_clients() -> None:
    """Close the shared upstream client, last, once no stream uses it."""
    from . import upstream

    await upstream.close_shared_client()
