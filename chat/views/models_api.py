"""`GET /v1/models` and `GET /v1/models/{id}`: the models a token's owner may use, in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import orjson
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from chat.auth.api_tokens import authenticate
from chat.lib.model_params import is_int
from chat.streaming.catalog import CatalogEntry, access_for, find, load_catalog
from chat.streaming.providers import makes_embeddings, model_item
from chat.views.metered_api import model_not_found, openai_error, unauthorized


def model_object(entry: CatalogEntry, listed_id: str) -> dict[str, Any]:
    """One model in OpenAI's shape: `created` the upstream's when its list gave one, `type` for an embedding model."""
    item = model_item(entry.provider, entry.model)
    created = item.get("created")
    out: dict[str, Any] = {
        "id": listed_id,
        "object": "model",
        "created": created if is_int(created) else int(entry.provider.created.timestamp()),
        "owned_by": entry.provider.name,
    }
    if makes_embeddings(entry.provider, entry.model):
        out["type"] = "embedding"
    return out


def listed(catalog: list[CatalogEntry]) -> list[tuple[CatalogEntry, str]]:
    """Each entry with the id it is listed under: the plain id, or `provider/model` where two providers list it."""
    seen: dict[str, int] = {}
    for entry in catalog:
        seen[entry.model] = seen.get(entry.model, 0) + 1
    return [(entry, entry.model if seen[entry.model] == 1 else entry.qualified) for entry in catalog]


async def _owners_catalog(request) -> list[CatalogEntry] | HttpResponse:
    if request.method != "GET":
        return openai_error(405, "Use GET.", "invalid_request_error", "method_not_allowed")
    token = await authenticate(request)
    if token is None:
        return unauthorized()
    return await load_catalog(await access_for(token.user))


@csrf_exempt  # a bearer token, no cookie; any method gets its JSON answer (405)
async def models(request):
    """The models this person may use, in OpenAI's list shape; `provider/model` where an id is listed twice."""
    catalog = await _owners_catalog(request)
    if isinstance(catalog, HttpResponse):
        return catalog
    data = [model_object(entry, name) for entry, name in listed(catalog)]
    return HttpResponse(orjson.dumps({"object": "list", "data": data}), content_type="application/json")


@csrf_exempt
async def model(request, model_id: str):
    """One model this person may use (openai-py's models.retrieve), by its listed id or as `provider/model`."""
    catalog = await _owners_catalog(request)
    if isinstance(catalog, HttpResponse):
        return catalog
    for entry, name in listed(catalog):
        if name == model_id:
            return HttpResponse(orjson.dumps(model_object(entry, name)), content_type="application/json")
    entry = find(catalog, model_id)
    if entry is not None:
        return HttpResponse(orjson.dumps(model_object(entry, model_id)), content_type="application/json")
    return model_not_found(model_id)
