"""Every other path under `/v1/`: a 404 in OpenAI's error JSON, which the SDKs raise with its message."""

from __future__ import annotations

from django.views.decorators.csrf import csrf_exempt

from chat.views.metered_api import openai_error


@csrf_exempt
async def unknown_path(request, rest: str = ""):
    """What OpenAI's API answers a path it does not serve, so a client says what was asked, not "Not Found"."""
    return openai_error(404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error", "unknown_url")
