"""Share links (a read-only page at /s/<token>/, the owner's list and revoke) and export/import of conversations."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.text import slugify
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from . import exports
from .models import ChatError, Conversation, ConversationRead, Share
from .views import api, error, json_body


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
        if not request.user.is_authenticated and Share.objects.filter(token=token).exists():
            return redirect_to_login(request.get_full_path())
        raise Http404(_("No such link."))
    if request.user.is_authenticated:
        ConversationRead.record(share.conversation, request.user, where="share link")
    content = share.content()
    context = {"share": share, "content": content, "owner": share.owner.get_username()}
    response = render(request, "chat/shared.html", context)
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = "no-referrer"  # the link is the secret: never sent on
    return response


def flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ChatError("bad_field", _("`%(name)s` must be true or false.") % {"name": name})
    return value


@require_http_methods(["GET", "POST"])
@api
def conversation_shares(request, conversation_id: int):
    """GET: this conversation's links; POST {live, public, show_usage}: a new one (201)."""
    conversation = owned(request.user, conversation_id)
    if request.method == "POST":
        body = json_body(request)
        share = Share.create_for(
            conversation, live=flag(body, "live"), public=flag(body, "public"), show_usage=flag(body, "show_usage")
        )
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


def download(body: str | dict, chosen: str, name: str) -> HttpResponse:
    if chosen == "json":
        response = JsonResponse(body, json_dumps_params={"ensure_ascii": False, "indent": 1})
    else:
        response = HttpResponse(body, content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.{chosen}"'
    return response


@require_GET
@api
def export_conversation(request, conversation_id: int):
    """One conversation: JSON (the whole tree, usage per answer) or Markdown (the branch shown)."""
    chosen = export_format(request)
    conversation = owned(request.user, conversation_id)
    name = slugify(conversation.title)[:60] or f"conversation-{conversation.pk}"
    if chosen == "json":
        return download(exports.export_json([conversation]), chosen, name)
    return download(exports.markdown(conversation), chosen, name)


@require_GET
@api
def export_all(request):
    """All of this person's conversations, oldest first, in one file."""
    chosen = export_format(request)
    conversations = Conversation.objects.owned_by(request.user).order_by("created", "pk")
    if chosen == "json":
        return download(exports.export_json(conversations), chosen, "conversations")
    return download(exports.markdown_all(conversations), chosen, "conversations")


@require_POST
@api
def import_conversations(request):
    """A JSON export in the body: stored as new conversations of this person (201 with their ids)."""
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > settings.CHAT_IMPORT_MAX_BYTES:
        return error(413, "too_large", exports.too_large_text())
    try:
        created = exports.import_conversations(request.user, request.body)
    except RequestDataTooBig:  # over REQUEST_MAX_BYTES, set lower than the import's own limit
        return error(413, "too_large", exports.too_large_text())
    except ChatError as exc:
        return error(413 if exc.code == "too_large" else 400, exc.code, exc.detail)
    return JsonResponse({"conversations": [{"id": c.pk, "title": c.title} for c in created]}, status=201)
