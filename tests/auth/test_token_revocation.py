"""Revoking an API token ends its running /v1 streams, as deactivating its owner does (issue 35)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.actions.streams import REVOKED
from chat.models import ApiToken, Usage
from tests.conftest import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)
ENDLESS = "[[delay:200]] [[chunks:100000]]"  # streams until stopped


async def first_event_then_rest(server, secret: str, revoke) -> bytes:
    """Open an endless stream, call `revoke` once its first chunk is here, and read it to its end."""
    body = {"model": "claude-sonnet-5", "messages": [{"role": "user", "content": ENDLESS}], "stream": True}
    received = b""
    async with httpx.AsyncClient(timeout=60) as client:
        headers = {"Authorization": f"Bearer {secret}"}
        async with client.stream("POST", server.url + "/v1/chat/completions", json=body, headers=headers) as answer:
            assert answer.status_code == 200
            revoked = False
            async with asyncio.timeout(60):  # an endless stream that is never stopped fails here
                async for piece in answer.aiter_raw():
                    received += piece
                    if not revoked and b"data: {" in received:
                        revoked = True
                        await revoke()
    return received


async def test_revoking_a_token_on_its_page_stops_its_running_stream(server, alice, providers, fake):
    token, secret = await sync_to_async(ApiToken.issue)(alice, "script")
    _, other = await sync_to_async(ApiToken.issue)(alice, "other")
    cookie = await sync_to_async(session_cookie)(alice)
    async with httpx.AsyncClient(base_url=server.url, cookies={"sessionid": cookie}) as browser:
        await browser.get("/settings/tokens/")

        async def revoke():
            form = {"csrfmiddlewaretoken": browser.cookies["csrftoken"]}
            assert (await browser.post(f"/settings/tokens/{token.pk}/revoke/", data=form)).status_code in (200, 302)

        received = await first_event_then_rest(server, secret, revoke)
    assert received.endswith(b"data: [DONE]\n\n") and REVOKED.encode() in received
    assert b'"code":"invalid_api_key"' in received  # not server_shutdown, after which a client would retry
    assert await asyncio.to_thread(fake.app.last().disconnected.wait, 30)  # the upstream was closed
    usage = await Usage.objects.aget()
    assert usage.status == "interrupted" and usage.error == REVOKED
    # Another token of the same person goes on working.
    async with httpx.AsyncClient() as client:
        listed = await client.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {other}"})
        assert listed.status_code == 200


async def test_a_revocation_the_server_is_not_told_of_stops_the_stream_too(server, alice, providers, fake):
    """A bulk UPDATE (or another process without Redis): the account check finds the token revoked."""
    token, secret = await sync_to_async(ApiToken.issue)(alice, "script")

    async def revoke():
        await ApiToken.objects.filter(pk=token.pk).aupdate(revoked=timezone.now())

    received = await first_event_then_rest(server, secret, revoke)
    assert received.endswith(b"data: [DONE]\n\n") and REVOKED.encode() in received
    assert b'"code":"invalid_api_key"' in received  # not server_shutdown, after which a client would retry
