"""The control channel: `stop` and `snapshot` requests reach the process running a stream, wherever asked.

Every streaming row records its worker, so a socket on any process sends its requests to the
owner's process-wide channel with the message id, and that process's listener hands them to
the running stream. The listener is started once and never cancelled while the process serves:
a per-stream listener cancelled at the end of each stream would, on channels-redis, drop
whatever message its BZPOPMIN had just popped (channels-redis #151, #165). What a request does
to a stream is the streaming feature's: it connects its handlers in ChatConfig.ready().
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from chat.models import Message, Worker
from chat.runtime import db_threads, process_loops
from chat.runtime.failures import FailureStreak, stop_if_cancelled

log = logging.getLogger(__name__)

USER_ENDED = "user.ended"
TOKEN_ENDED = "token.ended"
TABLES_CHANGED = "tables.changed"
# A request to another process waits this long for the channel layer; then a stop goes through the database.
SEND_WAIT = 2.0


@dataclass
class Handlers:
    """What the features do with a request; the defaults do nothing (a process that runs no streams)."""

    # Hand a request to the stream of its message on this process; False when none runs here.
    deliver: Callable[[dict], bool] = lambda request: False
    # Mark a reply whose process is dead as ended and tell its watchers (the stale lease, or None: any).
    recover: Callable[[Message, timedelta | None], Awaitable[None]] | None = None
    # Stop one user's streams on this process.
    end_user: Callable[[int], None] = lambda user_id: None
    # Stop one API token's streams on this process.
    end_token: Callable[[int], None] = lambda token_id: None
    # Forget what this process keeps of the tables admins set, or of one person's defaults (chat/runtime/kept_reads.py).
    tables_changed: Callable[[int | None], None] = lambda person: None


handlers = Handlers()


def connect(
    *,
    deliver: Callable[[dict], bool],
    recover: Callable[[Message, timedelta | None], Awaitable[None]],
    end_user: Callable[[int], None],
    end_token: Callable[[int], None] = lambda token_id: None,
    tables_changed: Callable[[int | None], None] = lambda person: None,
) -> None:
    """Set what requests do (ChatConfig.ready())."""
    handlers.deliver, handlers.recover, handlers.end_user = deliver, recover, end_user
    handlers.end_token, handlers.tables_changed = end_token, tables_changed


def control_request(kind: str, message_id: int, **fields: Any) -> dict:
    """A `stop` or `snapshot` request for the process streaming message_id."""
    return {"type": f"generation.{kind}", "message": message_id, **fields}


async def listen_forever(process: process_loops.Process) -> None:
    """The process's control listener: never cancelled while it serves, survives layer errors."""
    layer = get_channel_layer()
    streak = FailureStreak("control listener: cannot receive", "control listener: receiving again")
    while True:
        stop_if_cancelled()
        try:
            request = await layer.receive(process.channel)
        except Exception as exc:
            streak.failed(exc)
            await asyncio.sleep(min(0.2 * 2**streak.failures, 5.0))
            continue
        streak.over()
        if request.get("type") == USER_ENDED:
            handlers.end_user(request["user"])
        elif request.get("type") == TOKEN_ENDED:
            handlers.end_token(request["token"])
        elif request.get("type") == TABLES_CHANGED:
            handlers.tables_changed(request.get("person"))
        else:
            handlers.deliver(request)  # none: it ended; its `done` reaches the sockets through the conversation group


async def send_control(reply: Message, kind: str, **fields: Any) -> bool:
    """Send a control request to the process streaming `reply` (worker loaded); False when it is dead.

    A reply whose process is dead is marked interrupted here and now, and its
    watchers get `done`: nobody is left to answer.
    """
    if handlers.deliver(control_request(kind, reply.pk, **fields)):  # streamed here: no need for the layer
        return True
    worker = reply.worker
    lease = process_loops.lease()
    if worker is not None and worker.is_alive(lease):
        process = process_loops.current()
        if process is None or worker.pk != process.worker_id:
            await _send_to(worker.channel, reply, kind, fields)
        # else our own lease, but no such stream here: it has just ended, its `done` is on its way
        return True
    if worker is None and settings.REDIS_URL:
        return True  # a process that could not register its lease: nobody to ask, the sweep cannot tell
    if handlers.recover is not None:
        await handlers.recover(reply, lease if worker is not None else None)  # without Redis, one process: ours
    return False


def end_token_streams(token_id: int) -> None:
    """Ask every serving process to stop the `/v1` streams of a revoked API token, as end_user_streams."""
    _tell_every_process({"type": TOKEN_ENDED, "token": token_id}, f"to stop the streams of API token {token_id}")


async def _send_to(channel: str, reply: Message, kind: str, fields: dict) -> None:
    """A request to another process; when the channel layer cannot take it, a stop goes through the database.

    The owner checks its streams' rows for a stop every second (chat/actions/streams.py), so a stop
    reaches its stream whatever Redis does. A snapshot that cannot be asked for is not: the asking
    socket shows the saved text after its wait (ChatConsumer.snapshot_from_database).
    """
    try:
        await asyncio.wait_for(get_channel_layer().send(channel, control_request(kind, reply.pk, **fields)), SEND_WAIT)
        return
    except Exception as exc:
        log.warning("control: cannot send %s for message %s through the channel layer (%s)", kind, reply.pk, exc)
    if kind == "stop":
        await db_threads.run(Message.objects.request_stop)(reply.pk)
        log.info("control: stop for message %s asked through the database", reply.pk)


def end_user_streams(user_id: int) -> None:
    """Ask every serving process to stop this user's running streams, chat and `/v1` alike (sync code).

    With REDIS_URL every process with a current lease is told through its control channel.
    Without it there is one serving process, reachable only from inside it: from the admin
    it is told, from a management command (another process) it cannot be, and then the
    user's sockets are closed at their next frame and their streams run to their end.
    """
    _tell_every_process({"type": USER_ENDED, "user": user_id}, f"to stop the streams of user {user_id}")


def tell_tables_changed(person: int | None = None) -> None:
    """Tell every serving process that an access rule, a group or a provider changed, or one person's own chat
    defaults (sync code)."""
    _tell_every_process({"type": TABLES_CHANGED, "person": person}, "to read access rules, groups and providers again")


def _tell_every_process(request: dict, what: str) -> None:
    """Send `request` to every serving process's control channel; never raises, waits at most SEND_WAIT a process.

    Called once the change it tells of is committed, often in the request that made it: a database or
    Redis error here must not turn a saved change into an error page, nor hold that request for long.
    """

    async def tell() -> None:
        targets = channels
        if targets is None:
            process = process_loops.current()
            targets = [process.channel] if process is not None else []
        layer = get_channel_layer()
        for channel in targets:
            await asyncio.wait_for(layer.send(channel, request), SEND_WAIT)

    try:
        if settings.REDIS_URL:
            channels = list(Worker.objects.alive(process_loops.lease()).values_list("channel", flat=True))
        else:
            channels = None  # this process's own, if it serves (looked up on its loop)
        async_to_sync(tell)()
    except Exception as exc:  # the change itself stands: streams run to their end, kept reads expire
        log.warning("could not ask the processes %s: %r", what, exc)
