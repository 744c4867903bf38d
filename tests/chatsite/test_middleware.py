"""The middleware chain runs on the event loop (chatsite/middleware.py), and still does its work there."""

import httpx
import pytest
from django.utils.deprecation import MiddlewareMixin

from chat.compat.django import OnTheLoop
from chatsite.middleware import ASGIHandler


def chain_of(handler) -> list:
    """The middleware instances of a loaded handler, outermost first."""
    found, step = [], handler._middleware_chain
    while (middleware := getattr(step, "__wrapped__", None)) is not None and middleware is not step:
        found.append(middleware)
        step = getattr(middleware, "get_response", None)
    return found


def test_no_middleware_sends_a_request_to_a_thread():
    chain = chain_of(ASGIHandler())
    names = [type(m).__name__ for m in chain]
    assert {"SecurityMiddleware", "CsrfViewMiddleware", "XFrameOptionsMiddleware"} <= set(names)
    for middleware in chain:
        hooks = any(hasattr(middleware, hook) for hook in ("process_request", "process_response"))
        if isinstance(middleware, MiddlewareMixin) and hooks:
            # MiddlewareMixin's own __acall__ runs each hook through sync_to_async.
            assert isinstance(middleware, OnTheLoop), f"{type(middleware)} hops to a thread"


@pytest.mark.django_db(transaction=True)
def test_on_the_loop_the_server_still_sends_its_headers_and_checks_csrf(server):
    with httpx.Client(base_url=server.url) as browser:
        page = browser.get("/accounts/login/")
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["referrer-policy"] == "same-origin"
        assert "csrftoken" in browser.cookies
        form = {"username": "nobody", "password": "wrong"}
        assert browser.post("/accounts/login/", data=form).status_code == 403  # no token
        form["csrfmiddlewaretoken"] = browser.cookies["csrftoken"]
        assert browser.post("/accounts/login/", data=form).status_code == 200  # the form again, with its error


@pytest.mark.django_db(transaction=True)
async def test_v1_requests_share_one_thread_for_their_synchronous_work():
    """Django would start a thread for each request; /v1's share one, other paths keep their own.

    (/v1/chat/completions needs none: it skips the request machinery, tests/chatsite/test_completions.py.)"""
    import threading

    from asgiref.testing import ApplicationCommunicator
    from django.core.signals import request_finished, request_started

    threads: dict[str, set[str]] = {}

    def started(sender, scope, **kwargs):
        threads.setdefault(scope["path"], set()).add(threading.current_thread().name)

    def finished(sender, **kwargs):
        threads.setdefault("finished", set()).add(threading.current_thread().name)

    handler = ASGIHandler()
    request_started.connect(started)
    request_finished.connect(finished)
    try:
        for path in ("/v1/models", "/v1/models", "/accounts/login/", "/accounts/login/"):
            scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": [],
                     "server": ("testserver", 80), "client": ("127.0.0.1", 1)}  # fmt: skip
            app = ApplicationCommunicator(handler, scope)
            await app.send_input({"type": "http.request", "body": b""})
            assert (await app.receive_output(5))["type"] == "http.response.start"
            await app.wait(5)
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)
    assert threads["/v1/models"] == {"v1-sync_0"}
    assert len(threads["/accounts/login/"]) == 2 and "v1-sync_0" not in threads["/accounts/login/"]
    assert threads["finished"] >= {"v1-sync_0"} and len(threads["finished"]) == 3
