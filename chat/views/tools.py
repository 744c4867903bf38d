"""The composer's tools menu: the MCP servers and tools the signed-in person may use, and a conversation's choice."""

from __future__ import annotations

from django.http import JsonResponse
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from chat.models import ChatDefaults, ChatError, Conversation, access_of
from chat.streaming.tool_catalog import menu_for
from chat.views.json_api import api


@never_cache
@require_GET
@api
def tools(request):
    """{"servers": [{server, health, tools: [{name, tool, description}]}], "chosen": names switched on, or null: all}.

    For a new chat (no `conversation`), "chosen" is its default: the person's, else their group's.
    No URL, header or secret of a server is in it."""
    defaults = ChatDefaults.of(request.user)
    chosen = defaults.tools if defaults.tools is not None else access_of(request.user).tools
    conversation = request.GET.get("conversation")
    if conversation:
        if not conversation.isdigit():
            raise ChatError("not_found", _("No such conversation."))
        found = Conversation.objects.owned_by(request.user).filter(pk=int(conversation)).values_list("tools", flat=True)
        if not found:
            raise ChatError("not_found", _("No such conversation."))
        chosen = found[0]
    return JsonResponse({"servers": menu_for(request.user), "chosen": chosen})
