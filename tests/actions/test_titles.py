"""Titles written by a model after the first answer (chat/actions/titles.py), against the fake upstream."""

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from chat.actions import titles
from chat.metering import budgets
from chat.models import Budget, Conversation, Provider, Usage
from chat.streaming import generation
from tests.conftest import FAKE_KEY, MODELS

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]


@pytest.fixture(autouse=True)
def with_titles(settings):
    settings.CHAT_TITLES = True


def title_requests(fake) -> list:
    return [record for record in fake.app.streams if record.body["messages"][-1]["content"] == titles.INSTRUCTION]


async def first_turn(ws, content: str, model: str = I14) -> dict:
    """Send a new chat's first message; the frames up to the `title` frame."""
    await ws.send(type="send", conversation=None, content=content, model=model)
    frames = await ws.until("title")
    assert [f["type"] for f in frames].index("done") < len(frames) - 1  # `done` never waits for the title
    return frames


async def test_the_model_writes_the_title_after_the_first_answer(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    frames = await first_turn(ws, "**Plan** a trip to Lyon [[chunks:3]]")
    started, title = frames[0], frames[-1]
    # The fake's answer to the title request starts "Hi! This reply comes from the **demo upstream** (…":
    # the title is its first line without markdown, at most 60 characters.
    assert title == {"type": "title", "conversation": started["conversation"], "title": title["title"]}
    assert title["title"].startswith("Hi! This reply comes from the demo upstream (i14, model")
    assert len(title["title"]) <= 60 and "**" not in title["title"] and "`" not in title["title"]
    conversation = await Conversation.objects.aget(pk=started["conversation"])
    assert conversation.title == title["title"]

    # The request reached the upstream with the first exchange, and is metered as a title.
    (request,) = title_requests(fake)
    assert request.body["model"] == I14 and request.body["stream"] is True
    assert request.body["messages"][0] == {"role": "user", "content": "**Plan** a trip to Lyon [[chunks:3]]"}
    assert request.body["messages"][1]["role"] == "assistant" and request.body["messages"][1]["content"]
    row = await Usage.objects.aget(source=Usage.Source.TITLE)
    assert row.user_id == alice.pk and row.status == "complete" and row.message_id is None
    assert row.completion_tokens > 0 and row.reserved_tokens > titles.MAX_TOKENS  # reserved against the budget
    chat = await Usage.objects.aget(source=Usage.Source.CHAT)
    spent = await sync_to_async(budgets.month_spent)(alice)
    assert spent.tokens == chat.total_tokens + row.total_tokens  # the title counts in the month's budget

    # A second answer in the same conversation asks for no other title.
    await ws.send(type="send", conversation=started["conversation"], content="And Grenoble?")
    await ws.until("done")
    await generation.wait_all()
    assert len(title_requests(fake)) == 1
    assert await ws.nothing_more()


async def test_a_renamed_conversation_is_not_retitled_even_when_its_first_message_is_edited(
    connect, alice, providers, fake
):
    _, _, ws = await connect(alice)
    frames = await first_turn(ws, "Recipes with leeks")
    conversation_id, user_message = frames[0]["conversation"], frames[0]["user_message"]
    client = Client()
    await sync_to_async(client.force_login)(alice)
    response = await sync_to_async(client.patch)(
        f"/api/conversations/{conversation_id}", {"title": "Leeks"}, content_type="application/json"
    )
    assert response.status_code == 200
    # Editing the first message answers it anew: a first answer again, but the owner's title stays.
    await ws.send(type="edit", message=user_message, content="Recipes with onions")
    await ws.until("done")
    await generation.wait_all()
    assert len(title_requests(fake)) == 1
    assert (await Conversation.objects.aget(pk=conversation_id)).title == "Leeks"
    assert await ws.nothing_more()


async def test_editing_the_first_message_keeps_the_conversations_one_title(connect, alice, providers, fake):
    """One title per conversation: a branch from an edited first message does not retitle it (the title
    would follow the last edit, not the branch shown, and switching back would keep it)."""
    _, _, ws = await connect(alice)
    frames = await first_turn(ws, "Recipes with leeks")
    title = frames[-1]["title"]
    await ws.send(type="edit", message=frames[0]["user_message"], content="Recipes with onions")
    await ws.until("done")
    await generation.wait_all()
    assert len(title_requests(fake)) == 1
    assert (await Conversation.objects.aget(pk=frames[0]["conversation"])).title == title
    assert await ws.nothing_more()


async def test_a_failed_title_request_falls_back_to_the_first_line(connect, alice, providers, fake, settings):
    # A title model the upstream does not know: it answers 404 before the first byte.
    await Provider.objects.acreate(
        name="titles", base_url=fake.base_url("infyrence"), api_key=FAKE_KEY, model_list="no-such-model"
    )
    settings.CHAT_TITLE_MODEL = "titles/no-such-model"
    _, _, ws = await connect(alice)
    frames = await first_turn(ws, "# Budget *review* for [[chunks:2]] March\nand more")
    assert frames[-1]["title"] == "Budget review for March"
    assert fake.app.last().body["model"] == "no-such-model" and fake.app.last().status == 404
    row = await Usage.objects.aget(source=Usage.Source.TITLE)
    assert row.status == "failed" and row.model == "no-such-model" and "404" in row.error


async def test_over_budget_no_title_is_asked_and_the_first_line_stays(connect, alice, providers, fake):
    # The answer itself may start (nothing spent yet); after it the month's 50 tokens are used up.
    await Budget.objects.acreate(user=alice, tokens=50)
    _, _, ws = await connect(alice)
    frames = await first_turn(ws, "Quarterly *numbers* [[chunks:40]]")
    assert frames[-1]["title"] == "Quarterly numbers"
    assert title_requests(fake) == []
    assert not await Usage.objects.filter(source=Usage.Source.TITLE).aexists()


def test_a_models_title_is_cleaned_of_markdown_quotes_and_labels():
    assert Conversation.clean_title('Title: "**Lyon** in _two_ days."\nMore') == "Lyon in two days"
    assert Conversation.clean_title("\n\n# `Budget` [[x]] review\n") == "Budget review"
    assert Conversation.clean_title("“Quarterly numbers”") == "Quarterly numbers"
    assert Conversation.clean_title("  \n") == ""
    assert Conversation.clean_title("<think>\nA title about\nbudgets\n</think>\n\nBudget talk") == "Budget talk"
    assert len(Conversation.clean_title("word " * 40)) == 60
