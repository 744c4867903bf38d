"""Attachments over HTTP: upload (multipart, CSRF, session), download as a file, remove before sending.

Uploads come here rather than down the websocket: a 20 MB body has no place in frames that
stay under daphne's 1 MiB, and chatsite/server.py lets only this path's bodies past
REQUEST_MAX_BYTES (up to ATTACHMENT_MAX_FILE_BYTES). The `send` frame then names the ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.http import content_disposition_header
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from chat.actions.attachments import store_upload
from chat.lib import attachment_content
from chat.lib.key_turns import KeyTurns
from chat.models import Attachment, ChatError, ConversationRead
from chat.models.attachments import human_size
from chat.views.json_api import error

log = logging.getLogger(__name__)
_csrf = CsrfViewMiddleware(lambda request: None)

# Files read at once by this process (each in a child of its own, up to 1.5 GB): the rest wait their turn,
# spooled to disk, and are read into memory only when it comes.
_reading = asyncio.Semaphore(max(1, os.cpu_count() or 1))
# One file of a person's is read at a time.
_readers = KeyTurns()
# Each person's uploads in flight on this process (the event loop's alone: no lock).
_in_flight: dict[int, int] = {}

# A download is never a page of ours: no script, no styles, no frames, whatever it claims to be.
DOWNLOAD_POLICY = "default-src 'none'; img-src 'self'; sandbox"


@contextlib.asynccontextmanager
async def reading_turn(user_id: int) -> AsyncIterator[None]:
    """One of this process's reading slots, taken for one file of a person's at a time: a person's slow files
    (a crafted PDF takes ATTACHMENT_EXTRACT_SECONDS) hold one slot while others' files are read in the rest."""
    async with _readers.turn(user_id), _reading:
        yield


@csrf_exempt  # checked below, once the body is parsed: not on the thread every socket's database work shares
async def upload(request):
    """POST a multipart `file`: checked by content, read (text, or the image re-encoded), stored unsent."""
    if request.method != "POST":
        return error(405, "method_not_allowed", _("Use POST."))
    user = await request.auser()
    if not user.is_authenticated:
        return error(401, "unauthenticated", _("Sign in first."))
    if _in_flight.get(user.pk, 0) >= settings.ATTACHMENT_MAX_UPLOADS_IN_FLIGHT:
        return error(
            429, "too_many_uploads",
            _("You have %(count)s uploads in progress; wait for one to finish, then attach more.")
            % {"count": settings.ATTACHMENT_MAX_UPLOADS_IN_FLIGHT},
        )  # fmt: skip
    _in_flight[user.pk] = _in_flight.get(user.pk, 0) + 1
    try:
        return await _upload(request, user)
    finally:
        _in_flight[user.pk] -= 1
        if not _in_flight[user.pk]:
            del _in_flight[user.pk]


async def _upload(request, user):
    """The upload of one person, counted in flight."""
    # Django parses the multipart body (spooling a large file to disk) on a thread of its own; the
    # CSRF middleware would parse it on the shared one, which every socket's database work waits for.
    try:
        files = await sync_to_async(lambda: request.FILES, thread_sensitive=False)()
    except MultiPartParserError:  # a part's headers over Django's limit (a name of thousands of characters), …
        detail = _("The upload could not be read: its form data is malformed, or the file’s name is far too long.")
        return error(400, "bad_upload", detail)
    refused = await sync_to_async(_csrf.process_view, thread_sensitive=False)(request, None, (), {})
    if refused is not None:
        return refused
    upload = files.get("file")
    if upload is None:
        return error(400, "bad_field", _("Send the file as the multipart field `file`."))
    name = (upload.name or "attachment").replace("\\", "/").rsplit("/", 1)[-1]
    if upload.size > settings.ATTACHMENT_MAX_FILE_BYTES:
        return error(
            413, "file_too_large",
            _("%(name)s is %(size)s, over the limit of %(limit)s per file.")
            % {"name": name, "size": human_size(upload.size), "limit": human_size(settings.ATTACHMENT_MAX_FILE_BYTES)},
        )  # fmt: skip
    if upload.size == 0:
        return error(400, "empty_file", _("%(name)s is empty.") % {"name": name})
    try:
        async with reading_turn(user.pk):
            data = await asyncio.to_thread(upload.read)  # in memory only now, not while waiting for a turn
            timeout = settings.ATTACHMENT_EXTRACT_SECONDS
            inspected = await asyncio.to_thread(attachment_content.inspect_limited, data, timeout=timeout)
            del data
    except attachment_content.Unreadable as exc:
        return error(400, "unreadable", f"{name}: {exc.translated(_)}")
    if inspected.kind == "document" and inspected.tokens > settings.ATTACHMENT_MAX_MESSAGE_TOKENS:
        return error(
            400, "too_many_tokens",
            _("%(name)s comes to about %(tokens)s tokens, over the limit of %(limit)s per message.")
            % {"name": name, "tokens": f"{inspected.tokens:,}", "limit": f"{settings.ATTACHMENT_MAX_MESSAGE_TOKENS:,}"},
        )  # fmt: skip
    try:
        attachment = await sync_to_async(store_upload)(user, name, upload.size, inspected)
    except ChatError as exc:
        return error(400, exc.code, exc.detail)
    return JsonResponse(attachment.as_json(), status=201)


@require_http_methods(["GET", "DELETE"])
def attachment(request, attachment_id: int):
    """GET: the stored bytes as a download (owner, or staff who may view attachments); DELETE an unsent one."""
    if not request.user.is_authenticated:
        return error(401, "unauthenticated", _("Sign in first."))
    found = Attachment.objects.filter(pk=attachment_id).first()
    may_see = found is not None and (
        found.owner_id == request.user.pk or (request.method == "GET" and request.user.has_perm("chat.view_attachment"))
    )
    if not may_see:
        return error(404, "not_found", _("No such attachment."))
    if request.method == "DELETE":
        if found.message_id is not None:
            return error(400, "sent", _("This attachment was sent with a message; delete the conversation instead."))
        found.delete()
        return HttpResponse(status=204)
    if found.owner_id != request.user.pk:  # staff reading someone's file: recorded, as a conversation's read is
        ConversationRead.record_attachment(found, request.user, where="attachment download")
    # Images were re-encoded by Pillow when stored; anything else is an opaque download.
    content_type = found.content_type if found.kind == Attachment.Kind.IMAGE else "application/octet-stream"
    response = HttpResponse(found.read(), content_type=content_type)
    response["Content-Disposition"] = content_disposition_header(as_attachment=True, filename=found.name)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = DOWNLOAD_POLICY
    response["Cross-Origin-Resource-Policy"] = "same-origin"
    return response
