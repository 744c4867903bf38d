import asyncio
import logging

from django.apps import AppConfig
from django.db import DatabaseError

log = logging.getLogger(__name__)


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from chat import deploy_checks  # noqa: F401  (registers its checks)
        from chat.actions import orphans, streams, titles, tool_servers
        from chat.auth import session_sockets
        from chat.metering.summary_triggers import install_if_missing
        from chat.runtime import control, kept_reads, process_loops
        from chat.streaming import generation

        session_sockets.connect_signals()
        kept_reads.connect_signals()
        post_migrate.connect(install_if_missing, sender=self)
        # What every serving process runs beside its streams (chat/runtime/process_loops.py).
        process_loops.add_loop("control-listener", control.listen_forever)
        process_loops.add_loop("account-watch", session_sockets.watch_accounts_forever)
        process_loops.add_loop("api-checkpoints", streams.checkpoint_api_streams_forever)
        process_loops.add_loop("orphan-sweeper", orphans.sweep_forever, needs_redis=True)
        process_loops.add_loop("own-orphan-sweeper", orphans.sweep_own_forever)
        process_loops.add_loop("stops-from-database", streams.stops_from_database_forever)
        process_loops.add_loop("mcp-refresh", tool_servers.refresh_forever)
        control.connect(deliver=streams.deliver, recover=orphans.recover_one, end_user=end_user, end_token=end_token,
                        tables_changed=kept_reads.forget)  # fmt: skip
        generation.after_complete = titles.after_answer


def end_user(user_id: int) -> None:
    """A deactivation, told to every process (chat/runtime/control.py): its API tokens forgotten, its streams ended."""
    from chat.actions import streams
    from chat.auth import api_tokens

    api_tokens.forget_tokens(user_id=user_id)
    streams.end_local_user(user_id)


def end_token(token_id: int) -> None:
    """An API token's revocation, told to every process: forgotten, its `/v1` streams ended."""
    from chat.actions import streams
    from chat.auth import api_tokens

    api_tokens.forget_tokens(token_id=token_id)
    streams.end_local_token(token_id)


# Whether prepare_to_serve() has run to its end in this process, and when the process began serving.
_prepared = False
_serving_since = None
# Seconds between tries of prepare_to_serve() while the database is not ready (a process booted without it).
PREPARE_RETRY_SECONDS = 2.0
_retrying = None


def prepare_to_serve() -> bool:
    """Once per server process, before it serves: sync the configured provider, recover dead streams.

    False if the database is not ready; start_serving() then tries again until it is. Only the
    streams last written before this process began are taken for dead: one this process started
    meanwhile (its lease not registered yet) is alive.
    """
    try:
        _prepare()
    except DatabaseError as exc:
        log.error("database not ready (%s); run `manage.py migrate` if it is new; trying again meanwhile", exc)
        return False
    return True


def _prepare() -> None:
    from django.conf import settings
    from django.utils import timezone

    from chat.actions.orphans import recover_orphans
    from chat.models import Provider
    from chat.runtime import metrics
    from chat.runtime.process_loops import lease

    global _prepared, _serving_since
    if _serving_since is None:
        _serving_since = timezone.now()
    provider = Provider.objects.sync_from_settings()
    from chat.streaming.tool_catalog import sync_stdio_servers

    sync_stdio_servers()  # MCP_SERVERS_FILE's servers, for their groups and tools in the admin
    # One process alone owns every stream; beside others, only those whose lease expired are dead.
    stale_after = lease() if settings.REDIS_URL else None
    recovered = recover_orphans(stale_after, before=_serving_since)
    _prepared = True
    if recovered:
        log.warning("marked %d stream(s) left by a stopped server as interrupted", len(recovered))
        metrics.interrupted_after_crash.inc(len(recovered))
    if provider is not None and provider.is_demo:
        log.warning(
            "No UPSTREAM_BASE_URL set: chatting against the built-in demo upstream (provider 'demo', %s). "
            "Set UPSTREAM_BASE_URL and UPSTREAM_API_KEY for a real one.",
            provider.base_url,
        )


async def start_serving() -> None:
    """Start this process's lease, control listener and sweeps (chat/runtime/process_loops.py) at start-up.

    Otherwise a process starts them with its first socket or `/v1` request (daphne has no
    lifespan start-up), and one that has served neither would not sweep a dead peer's streams.
    A process that booted without its database keeps trying prepare_to_serve() here: a new
    install's provider would otherwise be created only at the next restart.
    """
    from chat.runtime import process_loops

    global _retrying
    if not _prepared and _retrying is None:
        _retrying = asyncio.get_running_loop().create_task(_prepare_until_ready(), name="prepare-to-serve")
    await process_loops.ensure_started()


async def _prepare_until_ready() -> None:
    from channels.db import database_sync_to_async

    from chat.runtime.failures import FailureStreak

    prepare = database_sync_to_async(_prepare, thread_sensitive=False)
    streak = FailureStreak("cannot prepare to serve yet", "prepared to serve")
    while not _prepared:
        await asyncio.sleep(PREPARE_RETRY_SECONDS)
        try:
            await prepare()
        except Exception as exc:  # the database's or any other: logged at the first and when it ends
            streak.failed(exc)
    streak.over()
    log.warning("database ready: the configured provider is synced and dead streams recovered")


def running_streams() -> list:
    """The chat generations of this process still streaming (asyncio tasks; a graceful shutdown waits for them)."""
    from chat.streaming import generation

    return generation.running()


async def end_streams(reason: str) -> None:
    """End every stream of this process now: `/v1` ones get an error event and [DONE], chats are interrupted.

    Their text and usage are saved now instead of waiting for the next start-up to find
    them still `streaming`; called by chatsite.server once the shutdown grace is over.
    """
    from chat.streaming import generation, relay

    relay.running.interrupt(reason)
    await generation.shutdown()


async def close_clients() -> None:
    """Close the shared upstream client, last, once no stream uses it."""
    from chat.streaming import upstream

    await upstream.close_shared_client()
