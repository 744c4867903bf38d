"""The chat, /v1 and titles read an upstream with one loop (UpstreamStream.read): a fault ends all three alike."""

import contextlib

import orjson
import pytest
from asgiref.sync import sync_to_async

from chat.actions import titles
from chat.models import ApiToken, Usage
from chat.streaming import generation
from chat.streaming.upstream import UpstreamError
from chatsite.middleware import ASGIHandler
from tests.chatsite.test_completions import answer, scope
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("dialect", "content", "status"),
    [
        pytest.param("i14", "[[fault:cut]] [[chunks:20]]", "interrupted", id="cut"),
        pytest.param("infyrence", "[[fault:eof]] [[chunks:20]]", "interrupted", id="ended without a finish"),
        pytest.param("api14", "[[fault:midstream]] [[chunks:20]]", "failed", id="an error event"),
        pytest.param("infyrence", "[[malformed:3]] [[chunks:20]]", "failed", id="unreadable events"),
    ],
)
async def test_a_fault_mid_stream_ends_a_chat_answer_a_v1_stream_and_a_title_alike(
    connect, alice, providers, fake, dialect, content, status
):
    model = MODELS[dialect]
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=content, model=model)
    done = (await ws.until("done"))[-1]
    await generation.wait_all()

    _, secret = await sync_to_async(ApiToken.issue)(alice, "tests")
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": content}], "stream": True})
    code, _, streamed = await answer(
        ASGIHandler(), scope(headers=[(b"authorization", b"Bearer " + secret.encode())]), body
    )

    request = titles.Request(0, alice, model, [{"role": "user", "content": content}], fallback="")
    with contextlib.suppress(UpstreamError):  # a title falls back to the first line then
        await titles.ask(request)

    assert done["status"] == status and code == 200 and streamed.endswith(b"data: [DONE]\n\n")
    endings = {
        row.source: (row.status, row.completion_tokens, row.reasoning_tokens, row.estimated)
        async for row in Usage.objects.all()
    }
    assert endings[Usage.Source.CHAT][0] == status and len(fake.app.streams) == 3
    assert endings[Usage.Source.CHAT] == endings[Usage.Source.API] == endings[Usage.Source.TITLE], endings
