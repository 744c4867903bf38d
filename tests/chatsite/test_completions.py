"""chatsite/completions.py: /v1/chat/completions past Django's handler, answering as Django's handler would."""

from __future__ import annotations

import logging

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.signals import request_started
from django.db import OperationalError

from chat.views import metered_api
from chatsite import completions
from chatsite.middleware import ASGIHandler, resolve


def scope(method="POST", host=b"127.0.0.1", headers=(), scheme="http"):
    return {
        "type": "http", "method": method, "path": completions.PATH, "query_string": b"", "scheme": scheme,
        "headers": [(b"host", host), (b"content-type", b"application/json"), *headers],
        "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
    }  # fmt: skip


async def answer(handler, request_scope, body=b"") -> tuple[int, list, bytes]:
    app = ApplicationCommunicator(handler, request_scope)
    await app.send_input({"type": "http.request", "body": body})
    start = await app.receive_output(5)
    content = b""
    while True:
        message = await app.receive_output(5)
        content += message.get("body", b"")
        if not message.get("more_body"):
            break
    await app.wait(5)
    return start["status"], start["headers"], content


def djangos() -> ASGIHandler:
    """The same handler with the path left to Django's own request handling."""
    handler = ASGIHandler()
    handler.completions_chain = None
    return handler


REQUESTS = [
    pytest.param({}, b'{"model": "x", "messages": []}', id="no token"),
    pytest.param({"method": "GET"}, b"", id="GET"),
    pytest.param({"headers": [(b"authorization", b"Bearer nope"), (b"accept-language", b"fr")]}, b"{}", id="bad token"),
    pytest.param({"host": b"evil.example"}, b"{}", id="a host not allowed"),
    pytest.param({"headers": [(b"user-agent", b"curl/8"), (b"cookie", b"django_language=fr")]}, b"[]", id="cookie"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fields, body", REQUESTS)
async def test_answers_equal_djangos_to_the_byte(fields, body):
    """Status, every header in order (security, language, cache) and the body, as Django's handler gives them."""
    ours = await answer(ASGIHandler(), scope(**fields), body)
    theirs = await answer(djangos(), scope(**fields), body)
    assert ours == theirs
    headers = dict(ours[1])
    assert headers[b"X-Content-Type-Options"] == b"nosniff" and b"Content-Security-Policy" in headers


@pytest.mark.django_db(transaction=True)
async def test_a_disallowed_host_is_refused_before_the_view(monkeypatch):
    called = []
    monkeypatch.setattr(metered_api, "caller", lambda secret, *more: called.append(secret))
    status, _, _ = await answer(ASGIHandler(), scope(host=b"evil.example", headers=[(b"authorization", b"Bearer x")]))
    assert status == 400 and called == []


@pytest.mark.django_db(transaction=True)
async def test_plain_http_is_redirected_when_https_is_required(settings):
    settings.SECURE_SSL_REDIRECT = True
    ours = await answer(ASGIHandler(), scope())
    assert ours[0] == 301 and (b"Location", b"https://127.0.0.1/v1/chat/completions") in ours[1]
    assert ours == await answer(djangos(), scope())


@pytest.mark.django_db(transaction=True)
async def test_a_database_that_cannot_be_had_is_a_503_and_a_bug_a_logged_500(monkeypatch, caplog):
    def down(secret, *more):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(metered_api, "caller", down)
    request = scope(headers=[(b"authorization", b"Bearer x")])
    status, headers, body = await answer(ASGIHandler(), request, b"{}")
    assert status == 503 and b"database_unavailable" in body and dict(headers)[b"Retry-After"]
    assert (status, headers, body) == await answer(djangos(), request, b"{}")

    def bug(secret, *more):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(metered_api, "caller", bug)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        status, _, _ = await answer(ASGIHandler(), request, b"{}")
    assert status == 500
    assert any(record.exc_info and record.exc_info[0] is ZeroDivisionError for record in caplog.records)


@pytest.mark.django_db(transaction=True)
async def test_no_request_signal_and_no_thread_for_the_path():
    """The point of the path: none of the request machinery runs, so nothing goes to a thread."""
    started = []

    def receiver(sender, **kwargs):
        started.append(kwargs["scope"]["path"])

    request_started.connect(receiver)
    try:
        await answer(ASGIHandler(), scope())
        assert started == []
        await answer(djangos(), scope())
        assert started == [completions.PATH]
    finally:
        request_started.disconnect(receiver)


def test_a_middleware_it_does_not_know_sends_the_path_back_to_django(settings):
    assert completions.chain(resolve) is not None
    # A plain hook middleware is applied like the others...
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    assert type(completions.chain(resolve)[-1]).__name__ == "GZipMiddleware"
    # ...one with a view hook, or a function middleware, is not understood here: Django serves the path.
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.contrib.admindocs.middleware.XViewMiddleware"]
    assert completions.chain(resolve) is None
    settings.MIDDLEWARE = [*settings.MIDDLEWARE[:-2], "tests.chatsite.test_completions.function_middleware"]
    assert completions.chain(resolve) is None
    assert ASGIHandler().completions_chain is None


def function_middleware(get_response):
    return get_response
