"""An answer's saves, for Generation (chat/streaming/generation.py): the growing text every
CHAT_SAVE_INTERVAL seconds, retried with backoff while the stream goes on, and the final save,
retried for up to CHAT_FINAL_SAVE_SECONDS; the caller sends `done` only once it landed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext_noop

from chat.metering import metered_streams, stream_metrics
from chat.models import Conversation, Message, Usage, fit, update_row
from chat.models.base import commit_with, update_read
from chat.runtime import db_threads, metrics

log = logging.getLogger(__name__)

UNSAVED_ERROR = gettext_noop("The answer could not be saved: the database was unavailable for too long.")


class AnswerSaves:
    """The database side of a Generation, which has what these read: its job and state, its text
    as a whole (_whole), its tool rounds and whether the current usage row is still open."""

    async def _save_loop(self) -> None:
        """Save the growing text every interval; on a database error retry with backoff, never give up."""
        job, interval = self.job, settings.CHAT_SAVE_INTERVAL
        saved_pieces, failures = 0, 0
        while True:
            await asyncio.sleep(interval if not failures else min(interval * 2**failures, 10.0))
            # Pieces are only ever appended (and never empty): a new count means new text.
            pieces = len(self.state.content) + len(self.state.reasoning)
            if pieces == saved_pieces:
                continue
            try:
                text = self._whole(self.state.text, self.state.reasoning_text)
                await db_threads.run(self._save_partial)(*text)
            except Exception as exc:
                failures += 1
                metrics.db_save_retries.labels("partial").inc()
                if failures == 1:
                    log.warning("generation %s: cannot save the partial answer (%s); retrying", job.message_id, exc)
                continue
            if failures:
                log.warning("generation %s: partial answer saved again after %d failure(s)", job.message_id, failures)
                failures = 0
            saved_pieces = pieces

    def _save_partial(self, content: str, reasoning: str) -> None:
        Message.objects.save_partial(self.job.message_id, content, reasoning)

    async def _store_final(self, status: str, error: str, usage: dict[str, Any]) -> bool:
        """The final save, retried with backoff for CHAT_FINAL_SAVE_SECONDS; False if it never landed."""
        job, loop = self.job, asyncio.get_running_loop()
        deadline = loop.time() + settings.CHAT_FINAL_SAVE_SECONDS
        attempt = 0
        while True:
            attempt += 1
            try:
                await db_threads.run(self._save_final)(status, error, usage)
            except asyncio.CancelledError:
                # The process is exiting mid-save (which may still land in its thread): say so loudly.
                log.error(
                    "generation %s: exiting before the final save landed; %d characters may be lost",
                    job.message_id,
                    len(self.state.text),
                )
                raise
            except Exception as exc:
                left = deadline - loop.time()
                if left <= 0:
                    log.error(
                        "generation %s: final save failed %d times, giving up (%s); the stored text is the "
                        "last partial save, %d characters are lost",
                        job.message_id,
                        attempt,
                        exc,
                        len(self.state.text),
                    )
                    return False
                log.warning("generation %s: final save failed (attempt %d: %s); retrying", job.message_id, attempt, exc)
                metrics.db_save_retries.labels("final").inc()
                try:
                    await asyncio.sleep(min(0.25 * 2**attempt, 10.0, left))
                except asyncio.CancelledError:
                    await self._last_try(status, error, usage)
                    raise
                continue
            if attempt > 1:
                log.warning("generation %s: final save landed after %d attempts", job.message_id, attempt)
                metrics.db_wait_seconds.observe(settings.CHAT_FINAL_SAVE_SECONDS - (deadline - loop.time()))
            return True

    async def _last_try(self, status: str, error: str, usage: dict[str, Any]) -> None:
        """One more final save while the process exits; logs loudly when even that fails."""
        try:
            await db_threads.run(self._save_final)(status, error, usage)
            log.warning("generation %s: final save landed while the process was exiting", self.job.message_id)
        except BaseException as exc:
            log.error(
                "generation %s: the process is exiting and the final save failed (%r); %d characters are lost",
                self.job.message_id,
                exc,
                len(self.state.text),
            )

    def _save_final(self, status: str, error: str, usage: dict[str, Any]) -> None:
        job, state = self.job, self.state
        now = timezone.now()
        content, reasoning = self._whole(state.text, state.reasoning_text)
        # A continued answer that did not think again keeps the time its first stream thought.
        thinking_ms = F("thinking_ms") if job.prefix is not None and self.thinking_ms is None else self.thinking_ms
        # A continued answer that called no tool this time keeps the rounds it had.
        rounds = {"tool_rounds": self.public_rounds() or None} if self.rounds or job.prefix is None else {}
        message = {
            **rounds,
            "content": content,
            "reasoning": reasoning,
            "tool_calls": self.unrun_tool_calls() or None,
            "thinking_ms": thinking_ms,
            "status": status,
            "finish_reason": fit(Message, "finish_reason", state.finish_reason),
            "error": error,
            "updated": now,
        }
        # The done frame shows the cost computed from the price table too. A stop during a tool round
        # finds the round's row settled already (chat/streaming/tool_rounds.py). The price is read
        # before the transaction, whose writes then go with its BEGIN and COMMIT in one round trip.
        settled = None
        if self.row_open:
            settled, settle = metered_streams.settle_write(
                self.usage_id, Usage.ending(state, status, error, usage), self.usage_key
            )
        with transaction.atomic():
            writes = []
            if isinstance(thinking_ms, F):
                update_row(Message, job.message_id, message)  # an expression: through the ORM, on its own
            else:
                writes.append(update_read(Message, job.message_id, message))
            if settled is not None:
                writes.append(settle)
                stream_metrics.settled(self.usage_id, settled)
            commit_with([*writes, update_read(Conversation, job.conversation_id, {"updated": now})])
        if settled is not None:  # once stored: a save tried again must not take a computed cost for a reported one
            usage["cost"] = settled["cost"]
