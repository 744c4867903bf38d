"""A page's fields (a websocket frame's, the conversation PATCH's, a preset's, an import's), checked.

Each parser gives the value to use or raises ChatError with a translated sentence; the
websocket sends it as an error frame, the views as a 400.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.translation import gettext as _

from chat.lib import model_params
from chat.models import ChatError
from chat.models.attachments import MAX_PER_MESSAGE as MAX_ATTACHMENTS


def parse_id(fields: dict, name: str, *, optional: bool = False) -> int | None:
    value = fields.get(name)
    if value is None and optional:
        return None
    if not model_params.is_int(value) or value < 1:
        raise ChatError("bad_field", _("`%(name)s` must be a positive integer id.") % {"name": name})
    return value


def parse_params(value: Any) -> dict[str, Any]:
    """The request parameters a user may set, checked by type and range (chat/lib/model_params.py)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ChatError("bad_field", _("`params` must be an object."))
    result: dict[str, Any] = {}
    for name, item in value.items():
        if item is not None and name in model_params.CHAT_PARAMS:
            try:
                item = model_params.check_param(name, item, max_tokens=settings.MAX_TOKENS_LIMIT)
            except model_params.ParamError as exc:
                raise ChatError("bad_param", exc.translated(_)) from None
        elif name not in model_params.CHAT_PARAMS:
            raise ChatError("bad_param", _("Unknown parameter `%(name)s`.") % {"name": name})
        result[name] = item  # None unsets a value stored on the conversation
    return result


def parse_system_prompt(value: Any) -> str | None:
    """The same limit as the conversation PATCH."""
    if value is None:
        return None
    try:
        return model_params.check_system_prompt(value)
    except model_params.ParamError as exc:
        raise ChatError("bad_field", exc.translated(_)) from None


def parse_tools(value: Any) -> list[str] | None:
    """The MCP tools switched on for a conversation ("server__tool" names); None: leave them as they are.

    Only a choice among the tools the person may use: the turn checks each against their access."""
    if value is None:
        return None
    names = value if isinstance(value, list) and len(value) <= 500 else None
    if names is None or not all(isinstance(v, str) and 0 < len(v) < 200 for v in names):
        raise ChatError("bad_field", _("`tools` must be a list of tool names."))
    return sorted(set(value))


def parse_content(value: Any, *, blank: bool = False) -> str:
    """The message's text; `blank` allows an empty one (a message of attachments alone)."""
    if not isinstance(value, str):
        raise ChatError("bad_field", _("`content` must be a string."))
    if not value.strip() and not blank:
        raise ChatError("empty_content", _("The message is empty."))
    if len(value.encode()) > settings.CHAT_MAX_CONTENT_BYTES:
        raise ChatError(
            "too_long",
            _("The message is longer than %(bytes)s bytes.") % {"bytes": settings.CHAT_MAX_CONTENT_BYTES},
        )
    return value


def parse_attachments(value: Any) -> list[int]:
    """The ids of uploads (POST /api/attachments) to send with the message."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_ATTACHMENTS or len(set(map(str, value))) != len(value):
        raise ChatError(
            "bad_field",
            _("`attachments` must be a list of at most %(count)s different ids.") % {"count": MAX_ATTACHMENTS},
        )
    for item in value:
        if not model_params.is_int(item) or item < 1:
            raise ChatError("bad_field", _("`attachments` must hold positive integer ids."))
    return value
