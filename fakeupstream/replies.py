"""Whole HTTP replies: a body with its length, a dialect's JSON error, a proxy's HTML error page."""

from __future__ import annotations

import http
from typing import Any

from fakeupstream.dialects import RETRY_AFTER, error_body
from fakeupstream.records import StreamRecord


async def respond(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """Send the whole reply: content-length first, then content-type (JSON unless HEADERS name one)."""
    if not any(name == b"content-type" for name, _ in headers):
        headers = [(b"content-type", b"application/json"), *headers]
    headers = [(b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(
    send: Any,
    dialect: str | None,
    status: int,
    message: str | None = None,
    *,
    type_: str | None = None,
    code: str | None = None,
    rid: str | None = None,
    allow: str | None = None,
    record: StreamRecord | None = None,
) -> None:
    """Send the dialect's error reply, with the headers that go with it, and note its status."""
    body = error_body(dialect, status, message, type_=type_, code=code, rid=rid)
    headers: list[tuple[bytes, bytes]] = []
    if dialect == "infyrence" and rid:
        headers.append((b"x-request-id", rid.encode()))
    if status == 429:
        headers.append((b"retry-after", RETRY_AFTER.encode()))
    if allow:
        headers.append((b"allow", allow.encode()))
    if record is not None:
        record.status = status
    await respond(send, status, body, headers)


def html_error_page(status: int) -> bytes:
    """The page an nginx in front of a provider answers an error with ([[html]])."""
    phrase = http.HTTPStatus(status).phrase
    page = f"<html>\r\n<head><title>{status} {phrase}</title></head>\r\n<body>\r\n"
    page += f"<center><h1>{status} {phrase}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n"
    page += "</html>\r\n" + "<!-- padding -->\r\n" * 6
    return page.encode()
