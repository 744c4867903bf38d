"""The page's JSON endpoints: signed-in callers, a JSON body, and errors in one shape."""

from __future__ import annotations

import functools

from django.http import JsonResponse
from django.utils.translation import gettext as _
from django.views import csrf, defaults

from chat.lib.json_depth import MAX_STORED_DEPTH, TooDeep, loads_stored
from chat.models import ChatError
from chat.views.metered_api import openai_error


def api(view):
    """JSON in and out for a signed-in user: 401 instead of a login redirect, ChatError as 400."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return error(401, "unauthenticated", _("Sign in first."))
        try:
            return view(request, *args, **kwargs)
        except ChatError as exc:
            return error({"not_found": 404, "forbidden": 403}.get(exc.code, 400), exc.code, exc.detail)

    return wrapper


def error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "detail": detail}}, status=status)


def csrf_failure(request, reason: str = ""):
    """CSRF_FAILURE_VIEW: under /api/ a JSON error the page shows, saying what to do; elsewhere Django's page.

    The token changes when the person signs in again (in another tab, say), and a page opened before
    then sends the old one.
    """
    if request.path.startswith("/api/"):
        detail = _("This page's security token is out of date (after a new sign-in, say): reload the page.")
        return error(403, "csrf_failed", detail)
    return csrf.csrf_failure(request, reason)


def bad_request(request, exception=None):
    """handler400 (a Host not in ALLOWED_HOSTS, say): JSON in each API's own shape, where a client reads JSON."""
    detail = "The request was refused: its Host header is not one this server answers to, or it is malformed."
    if request.path.startswith("/v1/"):
        return openai_error(400, detail, "invalid_request_error", "bad_request")
    if request.path.startswith("/api/"):
        return error(400, "bad_request", detail)
    return defaults.bad_request(request, exception)


def unknown_path(request, rest: str = "") -> JsonResponse:
    """Any other path under /api/: the page's fetch() reads a JSON error, not the HTML 404 page."""
    return error(404, "not_found", _("There is no %(path)s in this server's API.") % {"path": request.path[:200]})


def json_body(request) -> dict:
    try:
        body = loads_stored(request.body or b"{}")
    except TooDeep:
        detail = _("The body nests more than %(depth)s levels deep.") % {"depth": MAX_STORED_DEPTH}
        raise ChatError("bad_json", detail) from None
    except ValueError:  # not JSON, or text that cannot be stored: a lone surrogate, NaN
        raise ChatError("bad_json", _("The body is not valid JSON.")) from None
    if not isinstance(body, dict):
        raise ChatError("bad_json", _("The body must be a JSON object."))
    return body
