"""One completion limit per request: the reservation covers the one limit the upstream is sent (issue 35)."""

from __future__ import annotations

import httpx
import pytest
from asgiref.sync import sync_to_async

from chat.lib.model_params import check_request, one_token_limit, token_limit
from chat.models import ApiToken, Conversation, Usage
from chat.streaming import upstream
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]


def test_two_limits_that_disagree_become_the_smaller_one():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    checked = check_request({**body, "max_completion_tokens": 1, "max_tokens": 32768}, max_tokens=32768, max_n=1)
    assert checked["max_tokens"] == 1 and "max_completion_tokens" not in checked
    checked = check_request({**body, "max_completion_tokens": 7}, max_tokens=32768, max_n=1)
    assert checked["max_tokens"] == 7 and "max_completion_tokens" not in checked  # the field every upstream takes
    assert one_token_limit({"max_tokens": 9, "max_completion_tokens": 40}) == {"max_tokens": 9}
    assert token_limit({"max_tokens": 9, "max_completion_tokens": 40}, 8192) == 40  # unmerged: the largest
    assert token_limit({"max_completion_tokens": 40}, 8192) == 40 and token_limit({}, 8192) == 8192


def test_v1_forwards_one_limit_and_reserves_it(server, alice, providers, fake):
    secret = ApiToken.issue(alice, "tests")[1]
    content = "[[chunks:40]]"
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": I14, "messages": [{"role": "user", "content": content}], "stream": True,
              "max_completion_tokens": 1, "max_tokens": 32768},
        headers={"Authorization": f"Bearer {secret}"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    sent = fake.app.last().body
    assert sent["max_tokens"] == 1 and "max_completion_tokens" not in sent
    usage = Usage.objects.get()
    assert usage.reserved_tokens == upstream.estimate_tokens(len(content)) + 1
    assert usage.completion_tokens <= 1


def test_v1_sends_max_completion_tokens_as_max_tokens(server, alice, providers, fake):
    """Today's SDKs send only max_completion_tokens; i14 documents only max_tokens and stops at 100 without it."""
    secret = ApiToken.issue(alice, "tests")[1]
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": I14, "messages": [{"role": "user", "content": "[[chunks:150]]"}], "stream": False,
              "max_completion_tokens": 4000},
        headers={"Authorization": f"Bearer {secret}"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 200, response.text
    sent = fake.app.last().body
    assert sent["max_tokens"] == 4000 and "max_completion_tokens" not in sent
    assert response.json()["choices"][0]["finish_reason"] == "stop"  # not cut at i14's default of 100


async def test_a_conversations_two_limits_reserve_and_send_one(connect, alice, providers, fake):
    """A conversation's remembered params (stored before this check, or imported) holding both limits."""
    conversation = await sync_to_async(Conversation.objects.create)(
        owner=alice, model=f"i14/{I14}", params={"max_tokens": 32768, "max_completion_tokens": 2}
    )
    accepted, _, ws = await connect(alice)
    assert accepted
    await ws.send(type="send", conversation=conversation.pk, content="[[chunks:40]]", model=I14)
    frames = await ws.until("done")
    assert frames[-1]["type"] == "done"
    sent = fake.app.last().body
    assert sent["max_tokens"] == 2 and "max_completion_tokens" not in sent
    usage = await sync_to_async(Usage.objects.get)()
    assert usage.reserved_tokens == upstream.estimate_tokens(len("[[chunks:40]]")) + 2
