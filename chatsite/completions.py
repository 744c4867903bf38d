"""`/v1/chat/completions` from the ASGI handler straight to its view, past Django's request machinery.

Every `/v1` stream start went through all of Django's ASGI request handling: the
request_started receivers and the response's close() on a thread and back, a task for the
view and another listening for a disconnect, thirteen middleware layers each wrapped in its
exception converter, URL resolving, a 4xx logged from yet another thread, and a generator
per body chunk. The view needs none of it: it reads the method, the body, the Authorization
header and the scope, and does its database work on chat/runtime/db_threads.py's threads, so
this path, the busiest one, skips that machinery (docs/decisions/0001-completions-fast-path.md).

What those layers did for this path is kept, by calling Django's own code in Django's order
(chat/compat/django.py's serve_view): the hooks of the middleware in settings.MIDDLEWARE that
touch such a request (the Host check, the HTTPS redirect, the language, every security and
cache header), exceptions turned into responses as Django turns them (and a database that
cannot be had into a 503, as chat.runtime.db_busy's middleware does), 4xx and 5xx logged, and a
client that disconnects has its view or stream cancelled. A middleware this module does not
know makes `chain()` return None, and the path goes back to Django's handler: a new one is
never skipped unseen.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

from chat.compat.django import is_hook_middleware

PATH = "/v1/chat/completions"

# The middleware of settings.MIDDLEWARE that have nothing to do for this path, and why.
NOT_NEEDED = {
    "chatsite.middleware.StaticFilesMiddleware": "no static file is served under /v1/",
    "chatsite.middleware.SessionMiddleware": "the caller is its bearer token, never a session",
    "django.middleware.csrf.CsrfViewMiddleware": "the view is csrf_exempt (a bearer token, no cookie)",
    "chatsite.middleware.AuthenticationMiddleware": "request.user is never read",
    "chatsite.middleware.MessageMiddleware": "no message is ever added",
    "chat.runtime.db_busy.DatabaseBusyMiddleware": "its one hook, a busy database's 503, is applied below",
    "axes.middleware.AxesMiddleware": "it acts on sign-in attempts only",
}


def _unused(request):
    raise AssertionError("a hook-only middleware's get_response is never called here")


def chain(load=import_string) -> list | None:
    """Instances of the middleware whose process_request and process_response hooks apply, in order.

    None if one of settings.MIDDLEWARE is neither known unneeded nor a plain hook middleware:
    then the path is served by Django's handler as everything else is.
    """
    hooked = []
    for path in settings.MIDDLEWARE:
        if path in NOT_NEEDED:
            continue
        middleware = load(path)(_unused)
        plain = is_hook_middleware(middleware)
        hooks = hasattr(middleware, "process_request") or hasattr(middleware, "process_response")
        if not plain or not hooks or hasattr(middleware, "process_view") or hasattr(middleware, "process_exception"):
            return None
        hooked.append(middleware)
    return hooked


async def view(request):
    """The completions view, a database that cannot be had answered 503 as DatabaseBusyMiddleware would."""
    from chat.runtime import db_busy
    from chat.views.openai_api import chat_completions

    try:
        return await chat_completions(request)
    except Exception as exc:
        if db_busy.is_unavailable(exc):
            return db_busy.DatabaseBusyMiddleware(_unused).process_exception(request, exc)
        raise  # turned into a response as Django's handler would (serve_view)
