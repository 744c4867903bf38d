"""`/v1/chat/completions` from the ASGI handler straight to its view, past Django's request machinery.

Every `/v1` stream start went through all of Django's ASGI request handling: the
request_started receivers and the response's close() on a thread and back, a task for the
view and another listening for a disconnect, thirteen middleware layers each wrapped in its
exception converter, URL resolving, a 4xx logged from yet another thread, and a generator
per body chunk. The view needs none of it: it reads the method, the body, the Authorization
header and the scope, and does its database work on chat/db.py's threads. Measured with
bench/compare.py on one machine, this path takes a quarter of the server's CPU per
one-token answer away (README, "Benchmarks").

What those layers did for this path is kept, by calling Django's own code in Django's order:
the hooks of the middleware in settings.MIDDLEWARE that touch such a request (the Host
check, the HTTPS redirect, the language, every security and cache header), exceptions
turned into responses as Django turns them (and a database that cannot be had into a 503,
as chat.busy's middleware does), 4xx and 5xx logged, and a client that disconnects has its
view or stream cancelled. A middleware this module does not know makes `chain()` return
None, and the path goes back to Django's handler: a new one is never skipped unseen.
"""

from __future__ import annotations

import asyncio
import contextlib

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import get_script_prefix
from django.core.handlers.exception import response_for_exception
from django.urls import set_script_prefix, set_urlconf
from django.utils.deprecation import MiddlewareMixin
from django.utils.log import log_response
from django.utils.module_loading import import_string

PATH = "/v1/chat/completions"

# The middleware of settings.MIDDLEWARE that have nothing to do for this path, and why.
NOT_NEEDED = {
    "chatsite.middleware.StaticFilesMiddleware": "no static file is served under /v1/",
    "chatsite.middleware.SessionMiddleware": "the caller is its bearer token, never a session",
    "django.middleware.csrf.CsrfViewMiddleware": "the view is csrf_exempt (a bearer token, no cookie)",
    "chatsite.middleware.AuthenticationMiddleware": "request.user is never read",
    "chatsite.middleware.MessageMiddleware": "no message is ever added",
    "chat.busy.DatabaseBusyMiddleware": "its one hook, a busy database's 503, is applied below",
    "axes.middleware.AxesMiddleware": "it acts on sign-in attempts only",
}


def _unused(request):
    raise AssertionError("a hook-only middleware's get_response is never called here")


def chain(load=import_string) -> list | None:
    """Instances of the middleware whose process_request and process_response hooks apply, in order.

    None if one of settings.MIDDLEWARE is neither known unneeded nor a plain hook middleware:
    then the path is served by Django's handler as everything else is.
    """
    from .middleware import OnTheLoop  # it imports this module

    hooked = []
    for path in settings.MIDDLEWARE:
        if path in NOT_NEEDED:
            continue
        middleware = load(path)(_unused)
        kind = type(middleware)
        plain = kind.__call__ is MiddlewareMixin.__call__ and kind.__acall__ in (
            MiddlewareMixin.__acall__,
            OnTheLoop.__acall__,
        )
        hooks = hasattr(middleware, "process_request") or hasattr(middleware, "process_response")
        if not plain or not hooks or hasattr(middleware, "process_view") or hasattr(middleware, "process_exception"):
            return None
        hooked.append(middleware)
    return hooked


async def serve(handler, middleware: list, scope, receive, send) -> None:
    """One request to the completions view, as Django's handler would answer it."""
    try:
        body_file = await handler.read_body(receive)
    except RequestAborted:
        return
    set_script_prefix(get_script_prefix(scope))
    set_urlconf(settings.ROOT_URLCONF)
    request, response = handler.create_request(scope, body_file)
    try:
        if request is None:
            await handler.send_response(response, send)
            return
        current = asyncio.current_task()
        aborted = False

        async def listen() -> None:
            # As Django's handler does: a disconnect cancels the view or the stream it is sending.
            nonlocal aborted
            message = await receive()
            if message["type"] == "http.disconnect":
                aborted = True
                current.cancel()

        listener = asyncio.create_task(listen())
        try:
            await _respond(middleware, request, send)
        except asyncio.CancelledError:
            if not aborted or current.uncancel():
                raise
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
    finally:
        if request is not None:
            request.close()
        body_file.close()


async def _respond(middleware: list, request, send) -> None:
    # Django's order: process_request outside in; the layers entered give process_response inside
    # out, the one that answered included, the one that raised not (its exception became the response).
    response = None
    entered = 0
    try:
        for layer in middleware:
            if hasattr(layer, "process_request"):
                response = layer.process_request(request)
            entered += 1
            if response is not None:
                break
        else:
            response = await _view(request)
    except Exception as exc:  # from a process_request: the Host check, say
        response = response_for_exception(request, exc)
    for layer in reversed(middleware[:entered]):
        if hasattr(layer, "process_response"):
            response = layer.process_response(request, response)
    if response.status_code >= 400:
        log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
    await _send(response, send)


async def _view(request):
    from chat import busy
    from chat.api import chat_completions

    try:
        return await chat_completions(request)
    except Exception as exc:
        if busy.is_unavailable(exc):
            return busy.DatabaseBusyMiddleware(_unused).process_exception(request, exc)
        return response_for_exception(request, exc)


async def _send(response, send) -> None:
    headers = [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]
    headers += [
        (b"Set-Cookie", cookie.output(header="").encode("ascii").strip()) for cookie in response.cookies.values()
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    if not response.streaming:
        await send({"type": "http.response.body", "body": response.content})
        return
    # Our streams yield bytes: each part goes out as it is, in one message.
    parts = aiter(response)
    try:
        async for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
    finally:
        await response.aclose()
    await send({"type": "http.response.body"})
