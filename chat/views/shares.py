"""Share links (a read-only page at /s/<token>/, the owner's list and revoke) and export/import of conversations."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.text import slugify
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from chat.actions import export_stream, exports, imports, sidebar_events
from chat.actions.continuations import continue_shared as continue_shared_copy
from chat.actions.shares import create_share, shared_content
from chat.models import ChatError, Conversation, ConversationRead, Share
from chat.views.json_api import api, error, json_body


def owned(user, conversation_id: int) -> Conversation:
    found = Conversation.objects.owned_by(user).filter(pk=conversation_id).first()
    if found is None:
        raise ChatError("not_found", _("No such conversation."))
    return found


# --- share links -----------------------------------------------------------------


@never_cache
@require_GET
def shared(request, token: str):
    """The shared page: for signed-in people, or anyone when the owner made it public and the server allows it."""
    share = Share.objects.visible_to(request.user).select_related("conversation", "owner").filter(token=token).first()
    if share is None:
        if not request.user.is_authenticated and Share.objects.open_links().filter(token=token).exists():
            return redirect_to_login(request.get_full_path())
        raise Http404(_("No such link."))
    if request.user.is_authenticated:
        ConversationRead.record(share.conversation, request.user, where="share link")
    content = shared_content(share)
    context = {"share": share, "content": content, "owner": share.shown_name()}
    response = render(request, "chat/shared.html", context)
    response["X-Robots-Tag"] = "noindex, nofollow"
    # The link is the secret: never sent to another site. Same-origin, not no-referrer: under no-referrer
    # the browser sends "Origin: null" with the page's own form ("Continue in my chats"), which CSRF refuses.
    response["Referrer-Policy"] = "same-origin"
    return response


@require_POST
def continue_shared(request, token: str):
    """ "Continue in my chats": a copy of what the link shows in the reader's conversations, then opened there."""
    if not request.user.is_authenticated:  # sign in first, then back on the shared page
        return redirect_to_login(reverse("shared", args=[token]))
    share = Share.objects.visible_to(request.user).select_related("conversation", "owner").filter(token=token).first()
    if share is None:
        raise Http404(_("No such link."))
    # A copy is a read, whether or not the shared page was opened first.
    ConversationRead.record(share.conversation, request.user, where="share link, continued")
    try:
        conversation = continue_shared_copy(share, request.user)
        sidebar_events.listed(request.user.pk)
    except ChatError as exc:  # over the reader's storage quota: said on the page, nothing copied
        context = {"share": share, "content": shared_content(share), "owner": share.shown_name(),
                   "continue_error": exc.detail}  # fmt: skip
        response = render(request, "chat/shared.html", context, status=413 if exc.code == "quota_exceeded" else 400)
        response["Referrer-Policy"] = "same-origin"
        return response
    return redirect("conversation", conversation_id=conversation.pk)


def flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ChatError("bad_field", _("`%(name)s` must be true or false.") % {"name": name})
    return value


@require_http_methods(["GET", "POST"])
@api
def conversation_shares(request, conversation_id: int):
    """GET: this conversation's links; POST {live, public, show_usage, show_name}: a new one (201)."""
    conversation = owned(request.user, conversation_id)
    if request.method == "POST":
        body = json_body(request)
        share = create_share(
            conversation, live=flag(body, "live"), public=flag(body, "public"), show_usage=flag(body, "show_usage"),
            show_name=flag(body, "show_name"),
        )  # fmt: skip
        return JsonResponse(share.as_json(), status=201)
    return JsonResponse(share_list(conversation.shares.all()))


@require_GET
@api
def shares(request):
    """Every link this person made, newest first, with the title of its conversation."""
    rows = Share.objects.owned_by(request.user).select_related("conversation")
    return JsonResponse(share_list(rows, titles=True))


def share_list(rows, titles: bool = False) -> dict:
    return {
        "shares": [{**s.as_json(), **({"title": s.conversation.title} if titles else {})} for s in rows],
        "public_allowed": settings.CHAT_PUBLIC_SHARES,
    }


@require_http_methods(["DELETE"])
@api
def share(request, share_id: int):
    """Revoke a link: it is deleted with its copy, and opening it is a 404."""
    deleted, _rows = Share.objects.owned_by(request.user).filter(pk=share_id).delete()
    if not deleted:
        raise ChatError("not_found", _("No such link."))
    return HttpResponse(status=204)


# --- export and import -------------------------------------------------------------


def export_format(request) -> str:
    chosen = request.GET.get("format", "json")
    if chosen not in ("json", "md"):
        raise ChatError("bad_field", _("`format` must be md or json."))
    return chosen


def download(body, chosen: str, name: str) -> StreamingHttpResponse:
    """An export (chat/actions/export_stream.py) written to the download as it is read."""
    content_type = "application/json" if chosen == "json" else "text/markdown; charset=utf-8"
    response = StreamingHttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}.{chosen}"'
    return response


async def _export(request, conversation_id: int | None):
    user = await request.auser()
    if not user.is_authenticated:
        return error(401, "unauthenticated", _("Sign in first."))
    try:
        chosen = export_format(request)
        name = "conversations"
        if conversation_id is not None:
            conversation = await sync_to_async(owned)(user, conversation_id)
            name = slugify(conversation.title)[:60] or f"conversation-{conversation.pk}"
    except ChatError as exc:
        return error(404 if exc.code == "not_found" else 400, exc.code, exc.detail)
    write = export_stream.json_export if chosen == "json" else export_stream.markdown_export
    return download(write(user.pk, conversation_id), chosen, name)


@require_GET
async def export_conversation(request, conversation_id: int):
    """One conversation: JSON (the whole tree, usage per answer) or Markdown (the branch shown)."""
    return await _export(request, conversation_id)


@require_GET
async def export_all(request):
    """All of this person's conversations, oldest first, in one file."""
    return await _export(request, None)


@require_POST
async def import_conversations(request):
    """A JSON export in the body: stored as new conversations of this person (201 with their ids), in batches
    (chat/actions/imports.py); more than the server imports at once is a 413 that says the limit."""
    user = await request.auser()
    if not user.is_authenticated:
        return error(401, "unauthenticated", _("Sign in first."))
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.CHAT_IMPORT_MAX_BYTES:
        return error(413, "too_large", exports.too_large_text())
    try:
        created = await imports.import_conversations(user, request.body)
        await sync_to_async(sidebar_events.listed)(user.pk, sidebar_events.tab_of(request))
    except RequestDataTooBig:  # over REQUEST_MAX_BYTES, set lower than the import's own limit
        return error(413, "too_large", exports.too_large_text())
    except ChatError as exc:
        return error(413 if exc.code == "too_large" else 400, exc.code, exc.detail)
    return JsonResponse({"conversations": [{"id": c.pk, "title": c.title} for c in created]}, status=201)
