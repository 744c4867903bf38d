"""The JSON API of prompt presets and of a person's defaults for a new chat (session auth, CSRF)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Q
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from chat.lib.model_params import ParamError, check_param, check_system_prompt
from chat.lib.request_fields import parse_params, parse_tools
from chat.models import ChatDefaults, ChatError, PromptPreset
from chat.models.base import MODEL_MAX_LENGTH
from chat.models.presets import MAX_PRESET_TEXT
from chat.views.json_api import api, json_body

MAX_NAME = 100
# How many presets one person may keep: the "/" list is read whole.
MAX_PRESETS = 200


@never_cache
@require_http_methods(["GET", "POST"])
@api
def presets(request):
    """The person's presets and the published ones; POST creates one of theirs."""
    if request.method == "POST":
        if PromptPreset.objects.owned_by(request.user).count() >= MAX_PRESETS:
            raise ChatError(
                "too_many", _("You have %(count)d presets, the most one person may keep.") % {"count": MAX_PRESETS}
            )
        fields = preset_fields(request.user, json_body(request), partial=False)
        preset = PromptPreset.objects.create(owner=request.user, **fields)
        return JsonResponse(preset.as_json(request.user), status=201)
    rows = PromptPreset.objects.visible_to(request.user)
    return JsonResponse({"presets": [preset.as_json(request.user) for preset in rows]})


@never_cache
@require_http_methods(["GET", "PATCH", "DELETE"])
@api
def preset(request, preset_id: int):
    """One preset: read one's own or a published one; change or delete only one's own."""
    mine = Q(owner=request.user)
    found = PromptPreset.objects.filter(mine if request.method != "GET" else mine | Q(published=True))
    found = found.select_related("owner").filter(pk=preset_id).first()
    if found is None:
        raise ChatError("not_found", _("No such preset."))
    if request.method == "DELETE":
        found.delete()
        return HttpResponse(status=204)
    if request.method == "PATCH":
        for name, value in preset_fields(request.user, json_body(request), partial=True).items():
            setattr(found, name, value)
        found.updated = timezone.now()
        found.save()
    return JsonResponse(found.as_json(request.user))


def preset_fields(user, body: dict[str, Any], *, partial: bool) -> dict[str, Any]:
    """The fields of a preset from a request body, checked; `partial`: only those sent."""
    fields: dict[str, Any] = {}
    if "name" in body or not partial:
        name = body.get("name")
        if not isinstance(name, str) or not name.strip() or len(name.strip()) > MAX_NAME:
            raise ChatError(
                "bad_field", _("`name` must be a non-empty string of at most %(max)d characters.") % {"max": MAX_NAME}
            )
        fields["name"] = name.strip()
    for name, limit in (("text", MAX_PRESET_TEXT), ("model", MODEL_MAX_LENGTH)):
        if name in body:
            value = body[name] if body[name] is not None else ""
            if not isinstance(value, str) or len(value) > limit:
                raise ChatError(
                    "bad_field",
                    _("`%(name)s` must be a string of at most %(max)d characters.") % {"name": name, "max": limit},
                )
            fields[name] = value.strip() if name == "model" else value
    if "system_prompt" in body:
        fields["system_prompt"] = checked(check_system_prompt, body["system_prompt"] or "")
    if "params" in body:
        params = parse_params(body["params"])
        fields["params"] = {name: value for name, value in params.items() if value is not None}
    if "published" in body:
        if not isinstance(body["published"], bool):
            raise ChatError("bad_field", _("`published` must be true or false."))
        if body["published"] and not user.is_staff:
            raise ChatError("forbidden", _("Only staff may publish presets to everyone."))
        fields["published"] = body["published"]
    if ("text" in fields or not partial) and not (fields.get("text") or "").strip():
        raise ChatError("bad_field", _("A preset needs a text to insert."))
    return fields


def checked(check, value):
    try:
        return check(value)
    except ParamError as exc:
        raise ChatError("bad_field", exc.translated(_)) from None


@never_cache
@require_http_methods(["GET", "PUT"])
@api
def defaults(request):
    """The person's defaults for a new chat (model, temperature, system prompt, tools); PUT replaces them."""
    mine = ChatDefaults.of(request.user)
    if request.method == "PUT":
        body = json_body(request)
        model = body.get("model") or ""
        if not isinstance(model, str) or len(model) > MODEL_MAX_LENGTH:
            raise ChatError("bad_field", _("`model` must be a model id."))
        temperature = body.get("temperature")
        if temperature is not None:
            try:
                temperature = check_param("temperature", temperature, max_tokens=settings.MAX_TOKENS_LIMIT)
            except ParamError as exc:
                raise ChatError("bad_param", exc.translated(_)) from None
        mine.model = model.strip()
        mine.temperature = temperature
        mine.system_prompt = checked(check_system_prompt, body.get("system_prompt") or "")
        if "tools" in body:  # absent: as they were
            mine.tools = parse_tools(body["tools"])
        mine.save()
    return JsonResponse(mine.as_json())
