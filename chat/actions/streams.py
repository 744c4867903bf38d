"""This process's running streams, reached from outside them: a control request, a user's streams ended,
the /v1 streams' progress saved."""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings

from chat.models import Message, Usage
from chat.runtime import db_threads, process_loops
from chat.runtime.failures import every
from chat.streaming import relay
from chat.streaming.generation import Generation, running_generation, running_messages, stop_user, track

log = logging.getLogger(__name__)

DEACTIVATED = "the account was deactivated"
REVOKED = "the API token was revoked"


def deliver(request: dict) -> bool:
    """Hand a control request (`stop`, `snapshot`) to its message's stream here; False when none runs here."""
    generation = running_generation(request.get("message"))
    if generation is None:
        return False
    track(asyncio.create_task(_handle(generation, request)))
    return True


async def _handle(generation: Generation, request: dict) -> None:
    try:
        await generation.handle(request)
    except Exception:
        log.exception("generation %s: control request %s failed", generation.job.message_id, request.get("type"))


# How often a process looks for stops asked through the database (chat/runtime/control.py, the admin).
STOP_CHECK_SECONDS = 1.0


async def stops_from_database_forever(process: process_loops.Process) -> None:
    """Stop this process's streams whose rows ask for it: a stop sent while Redis was away, or the admin's.

    One read by primary key a second, only while this process streams.
    """
    check = db_threads.run(Message.objects.stops_requested)

    async def step() -> None:
        running = running_messages()
        if not running:
            return
        for pk in await check(running):
            generation = running_generation(pk)
            if generation is not None:
                log.info("generation %s: stopped as its row asked", pk)
                generation.stop()

    await every(
        lambda failures: min(STOP_CHECK_SECONDS * 2**failures, 10.0),
        step,
        "cannot read the stops asked through the database",
        "stops asked through the database read again",
    )


def end_local_user(user_id: int) -> None:
    """Stop this process's streams of one user: chat generations and `/v1` relays."""
    # A /v1 client is told its key no longer works, as a new request would be (not to retry, as after a restart).
    stopped = stop_user(user_id) + relay.running.interrupt(DEACTIVATED, owner=user_id, code="invalid_api_key")
    if stopped:
        log.info("stopped %d stream(s) of deactivated user %s", stopped, user_id)


def end_local_token(token_id: int) -> None:
    """Stop this process's `/v1` streams made with one API token (revoked)."""
    stopped = relay.running.interrupt(REVOKED, token=token_id, code="invalid_api_key")
    if stopped:
        log.info("stopped %d stream(s) of revoked API token %s", stopped, token_id)


async def checkpoint_api_streams_forever(process: process_loops.Process) -> None:
    """Write the /v1 streams' tokens so far on their usage rows every API_CHECKPOINT_SECONDS.

    /v1 keeps no text: without this, a stream whose process dies is swept with no completion
    tokens. One transaction for all of this process's streams, none per token.
    """
    write = db_threads.run(Usage.objects.checkpoint)

    def interval(failures: int) -> float:
        return min(settings.API_CHECKPOINT_SECONDS * 2**failures, max(settings.API_CHECKPOINT_SECONDS, 60.0))

    await every(
        interval,
        lambda: relay.running.checkpoint(write, process.loop.time()),
        "cannot write the API streams' progress",
        "API streams' progress written again",
    )
