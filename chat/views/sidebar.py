"""Organising conversations: the sidebar's pages (cursor on updated, pk), pin, archive, folders, delete all.

The list is paged by a cursor, never an offset: a page is the rows older than the last one
shown, so a conversation updated meanwhile cannot make a row appear twice or be skipped.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_http_methods, require_POST

from chat.actions import sidebar_events
from chat.actions.deletes import delete_conversations
from chat.lib.snippets import snippet
from chat.models import ChatError, Conversation, Folder
from chat.models.folders import MAX_FOLDER_NAME
from chat.views.json_api import api, json_body

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
SUMMARY_FIELDS = ("id", "title", "model", "updated", "pinned", "archived", "folder_id")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def cursor_for(row: dict) -> str:
    """The position after `row`: its `updated` in whole microseconds (exact, unlike a float) and its id."""
    return f"{(row['updated'] - EPOCH) // timedelta(microseconds=1)}_{row['id']}"


def parse_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        micros, pk = (int(part) for part in cursor.split("_"))
        return EPOCH + timedelta(microseconds=micros), pk
    except (ValueError, OverflowError):
        raise ChatError("bad_cursor", "`cursor` is not one this API gave.") from None


def summary(row: dict) -> dict:
    row = dict(row)
    row["folder"] = row.pop("folder_id")
    return {**row, "updated": row["updated"].isoformat()}


def page(user, params) -> dict:
    """One page of the user's conversations for GET /api/conversations (docs/organising.md).

    `q`: all of them whose title or text matches, archived ones too; `archived=1`: the archived
    ones; `folder=<id>`: one folder's; otherwise the unfiled ones, and on the first page (no
    `cursor`) the pinned ones and the folders as well. `cursor`: the `next` of the page before.
    """
    query = params.get("q", "").strip()[:200]
    try:
        limit = min(max(int(params.get("limit", PAGE_SIZE)), 1), MAX_PAGE_SIZE)
    except ValueError:
        raise ChatError("bad_field", "`limit` must be a number.") from None
    mine = Conversation.objects.owned_by(user)
    extra: dict = {}
    if query:
        rows = mine.search(query)
    elif params.get("archived") in ("1", "true"):
        rows = mine.filter(archived=True)
    elif params.get("folder"):
        folder = folder_of(user, params["folder"])
        rows = mine.filter(folder=folder, archived=False, pinned=False)
    else:
        rows = mine.listed()
        if not params.get("cursor"):
            pinned = mine.filter(pinned=True, archived=False).newest_first().values(*SUMMARY_FIELDS)
            extra["pinned"] = [summary(row) for row in pinned]
            extra["folders"] = [folder.as_json() for folder in Folder.objects.owned_by(user).with_counts()]
    if params.get("cursor"):
        rows = rows.page_after(*parse_cursor(params["cursor"]))
    found = list(rows.newest_first().values(*SUMMARY_FIELDS)[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    conversations = [summary(row) for row in found]
    if query:  # where the words are: a line of the first message that has them
        excerpts = Conversation.objects.filter(pk__in=[row["id"] for row in found]).excerpts(query)
        for row in conversations:
            row["snippet"] = snippet(excerpts.get(row["id"], ""), query)
    return {
        "conversations": conversations,
        "next": cursor_for(found[-1]) if more else None,
        **extra,
    }


def folder_of(user, folder_id) -> Folder:
    """The user's folder `folder_id`; anyone else's, or none, is not found."""
    try:
        pk = int(folder_id)
    except (TypeError, ValueError):
        raise ChatError("not_found", _("No such folder.")) from None
    found = Folder.objects.owned_by(user).filter(pk=pk).first()
    if found is None:
        raise ChatError("not_found", _("No such folder."))
    return found


def update(conversation: Conversation, body: dict) -> list[str]:
    """PATCH's organising fields: `pinned`, `archived` (booleans) and `folder` (an id of the owner's, or null)."""
    fields = []
    for name in ("pinned", "archived"):
        if name in body:
            if not isinstance(body[name], bool):
                raise ChatError("bad_field", f"`{name}` must be true or false.")
            setattr(conversation, name, body[name])
            fields.append(name)
    if "folder" in body:
        conversation.folder = None if body["folder"] is None else folder_of(conversation.owner, body["folder"])
        fields.append("folder")
    return fields


def folder_name(body: dict) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ChatError("bad_field", _("A folder needs a name."))
    return name.strip()[:MAX_FOLDER_NAME]


# --- the folders' API ------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@api
def folders(request):
    """GET: the user's folders with their counts; POST {name}: a new one."""
    if request.method == "POST":
        folder = Folder.objects.create(owner=request.user, name=folder_name(json_body(request)))
        folder.count = 0
        sidebar_events.listed(request.user.pk, sidebar_events.tab_of(request))
        return JsonResponse(folder.as_json(), status=201)
    return JsonResponse({"folders": [f.as_json() for f in Folder.objects.owned_by(request.user).with_counts()]})


@require_http_methods(["PATCH", "DELETE"])
@api
def folder(request, folder_id: int):
    """PATCH {name}: rename; DELETE: remove the folder, its conversations stay (unfiled)."""
    found = folder_of(request.user, folder_id)
    if request.method == "DELETE":
        found.delete()  # Conversation.folder is SET_NULL
        sidebar_events.listed(request.user.pk, sidebar_events.tab_of(request))
        return HttpResponse(status=204)
    found.name = folder_name(json_body(request))
    found.save(update_fields=["name"])
    sidebar_events.listed(request.user.pk, sidebar_events.tab_of(request))
    return JsonResponse(Folder.objects.owned_by(request.user).with_counts().get(pk=found.pk).as_json())


# --- delete all (the settings page) ----------------------------------------------------------


@login_required
@require_POST
def delete_all(request):
    """Delete every conversation of the signed-in person, once they ticked the confirmation box."""
    if request.POST.get("confirm") != "yes":
        messages.error(request, _("Tick the box to confirm: nothing was deleted."), extra_tags="delete-all")
        return redirect("settings")
    count = delete_conversations(Conversation.objects.owned_by(request.user), sidebar_events.tab_of(request))
    messages.success(
        request,
        ngettext(
            "%(count)d conversation deleted; your usage records are kept.",
            "%(count)d conversations deleted; your usage records are kept.",
            count,
        )
        % {"count": count},
        extra_tags="delete-all",
    )
    return redirect("settings")
