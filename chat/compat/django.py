"""Django's internals that the middleware chain and the `/v1/chat/completions` path rely on.

Written against Django 5.2.19 (requirements.lock); tests/compat/test_compat_django.py fails when
one of these changes.

* MiddlewareMixin (django/utils/deprecation.py): the `async_mode` its __init__ sets when the
  next layer is a coroutine function, and its `__acall__`, which sends process_request and
  process_response each to a thread and back (sync_to_async). OnTheLoop is that __acall__
  without the threads: for hooks that do no I/O a hand-off costs more than the hook, and it
  was paid on every request and every `/v1` stream start. Django ticket #37177 (pull request
  django/django#21523, open) makes Django's own middleware skip those hand-offs for the same
  reason. is_hook_middleware() recognises a middleware by those same two methods.
* BaseHandler.load_middleware (django/core/handlers/base.py) imports each settings.MIDDLEWARE
  entry through that module's own `import_string`. middleware_resolved_by() swaps that name
  while a handler loads its chain, so settings.MIDDLEWARE keeps the names `check --deploy`
  looks for while the chain is built from other classes.
* ASGIHandler.handle (django/core/handlers/asgi.py) and BaseHandler's middleware order:
  serve_view() answers one request as handle() would, from the same pieces (read_body,
  create_request, get_script_prefix, response_for_exception, log_response, the header and
  cookie encoding of send_response), without the request signals, the thread for synchronous
  work, the task per request and the exception wrapper per middleware layer, which made most
  of a `/v1` stream start's cost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import get_script_prefix
from django.core.handlers.exception import response_for_exception
from django.urls import set_script_prefix, set_urlconf
from django.utils.deprecation import MiddlewareMixin
from django.utils.log import log_response


class OnTheLoop:
    """For a MiddlewareMixin whose hooks do no I/O: in async mode they run on the event loop, not a thread."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        process_view = getattr(self, "process_view", None)
        if self.async_mode and process_view is not None and not iscoroutinefunction(process_view):
            # The handler calls process_view itself and would send a sync one to a thread.
            self.process_view = self.inline_view(process_view)

    def inline_view(self, process_view):
        """An async process_view running the sync `process_view` on the loop (a subclass may send some to a thread)."""

        async def inline_view(request, view, args, kwargs):
            return process_view(request, view, args, kwargs)

        return inline_view

    async def __acall__(self, request):
        response = self.process_request(request) if hasattr(self, "process_request") else None
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            if self.response_writes(request):
                response = await sync_to_async(self.process_response)(request, response)
            else:
                response = self.process_response(request, response)
        return response

    def response_writes(self, request) -> bool:
        """Whether process_response will do I/O for this request (then it goes to a thread)."""
        return False


def is_hook_middleware(middleware) -> bool:
    """Whether calling `middleware` only runs its hooks around the next layer (MiddlewareMixin's own call does)."""
    kind = type(middleware)
    return kind.__call__ is MiddlewareMixin.__call__ and kind.__acall__ in (
        MiddlewareMixin.__acall__,
        OnTheLoop.__acall__,
    )


@contextlib.contextmanager
def middleware_resolved_by(resolve: Callable[[str], type]) -> Iterator[None]:
    """In the block, a handler's load_middleware() takes each class of settings.MIDDLEWARE from `resolve(path)`."""
    imported = base.import_string
    base.import_string = resolve
    try:
        yield
    finally:
        base.import_string = imported


async def serve_view(handler, middleware: list, view: Callable[..., Awaitable], scope, receive, send) -> None:
    """One request to the async `view` through the hooks of `middleware`, answered as Django's `handler` would."""
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
            await _respond(middleware, view, request, send)
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


async def _respond(middleware: list, view, request, send) -> None:
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
            response = await view(request)
    except Exception as exc:  # from a process_request (the Host check, say) or the view
        response = response_for_exception(request, exc)
    for layer in reversed(middleware[:entered]):
        if hasattr(layer, "process_response"):
            response = layer.process_response(request, response)
    if response.status_code >= 400:
        log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
    await _send(response, send)


async def _send(response, send) -> None:
    headers = [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]
    headers += [
        (b"Set-Cookie", cookie.output(header="").encode("ascii").strip()) for cookie in response.cookies.values()
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    if not response.streaming:
        await send({"type": "http.response.body", "body": response.content})
        return
    # The view's streams yield bytes: each part goes out as it is, in one message.
    parts = aiter(response)
    try:
        async for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
    finally:
        await response.aclose()
    await send({"type": "http.response.body"})
