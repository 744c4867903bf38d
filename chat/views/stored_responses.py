"""`GET` and `DELETE /v1/responses/{id}`: a person's stored responses (what previous_response_id names)."""

from __future__ import annotations

from typing import Any

import orjson
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from chat.auth.api_tokens import authenticate
from chat.models import StoredResponse
from chat.runtime import db_threads
from chat.views.metered_api import openai_error, unauthorized
from chat.views.responses_api import not_found


def response_object(row: StoredResponse) -> dict[str, Any]:
    """What is kept of a response: its id, time, status, model, output and the response it followed."""
    return {
        "id": row.pk,
        "object": "response",
        "created_at": int(row.created.timestamp()),
        "status": row.status,
        "model": row.model,
        "output": row.output,
        "previous_response_id": row.previous or None,
    }


@csrf_exempt  # a bearer token, no cookie; another method gets its JSON answer (405)
async def stored_response(request, response_id: str):
    """Read or delete one of the token owner's stored responses; another person's is as unknown as a made-up id."""
    if request.method not in ("GET", "DELETE"):
        return openai_error(405, "Use GET or DELETE.", "invalid_request_error", "method_not_allowed")
    token = await authenticate(request)
    if token is None:
        return unauthorized()
    mine = StoredResponse.objects.owned_by(token.user).filter(pk=response_id)
    if request.method == "DELETE":
        deleted, _ = await db_threads.run(mine.delete)()
        body = {"id": response_id, "object": "response", "deleted": True} if deleted else None
    else:
        row = await db_threads.run(mine.first)()
        body = response_object(row) if row is not None else None
    if body is None:
        return not_found(f"Response with id '{response_id}' not found.", None).response
    return HttpResponse(orjson.dumps(body), content_type="application/json")
