"""The provider's key, echoed by an upstream in an answer, never reaches a /v1 client (issue 35)."""

from __future__ import annotations

import math

import httpx
import pytest

from chat.models import ApiToken
from chat.streaming.relay import Relay
from chat.streaming.upstream import StreamState, UpstreamStream, redact_secrets
from tests.conftest import FAKE_KEY, MODELS
from tests.streaming.test_relay import ScriptedResponse, data_events

KEY = "sk-provider-secret-0123456789"


def test_only_the_secret_itself_is_redacted():
    answer = b'{"content":"key ' + KEY.encode() + b' and Authorization: Bearer $TOKEN"}'
    assert redact_secrets(answer, [KEY]) == b'{"content":"key [redacted] and Authorization: Bearer $TOKEN"}'
    clean = b'{"content":"nothing here"}'
    assert redact_secrets(clean, [KEY]) is clean and redact_secrets(clean, ["x"]) is clean


async def test_a_streamed_chunk_carrying_the_key_is_redacted():
    chunk = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + KEY.encode() + b'"}}]}\n\n'
    stream = UpstreamStream(ScriptedResponse(chunk + b"data: [DONE]\n\n"), deadline_at=math.inf)
    relay = Relay(stream, StreamState(started_at=0.0, secrets=(KEY,)), forward_usage=True, heartbeat=5.0)
    sent = b"".join([data async for data in relay])
    assert KEY.encode() not in sent and b'"content":"[redacted]"' in sent
    assert data_events(sent)[-1] == b"data: [DONE]\n\n"


@pytest.mark.django_db(transaction=True)
def test_a_whole_answer_echoing_the_key_is_redacted(server, alice, providers, fake):
    secret = ApiToken.issue(alice, "tests")[1]
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": MODELS["infyrence"], "messages": [{"role": "user", "content": f"[[echo]] {FAKE_KEY}"}]},
        headers={"Authorization": f"Bearer {secret}"}, timeout=30,
    )  # fmt: skip
    # The fake answers with the words of the message: the key, as an upstream that echoes it would.
    assert response.status_code == 200 and FAKE_KEY not in response.text
    assert response.json()["choices"][0]["message"]["content"] == "[redacted]"
