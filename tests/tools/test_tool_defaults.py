"""The tools a new chat starts with: the person's default (settings page), else their group's, else every tool."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from chat.models import ChatDefaults, GroupDefaults
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = '[[call:tests.echo {"text": "hi"}]]'


def offered(fake) -> list[str]:
    return sorted(tool["function"]["name"] for tool in fake.app.last().body.get("tools", []))


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_menu_and_the_settings_give_the_group_default_then_the_persons(alice, team, tools_server):
    team.user_set.add(alice)
    client = signed_in(alice)
    assert client.get("/api/tools").json()["chosen"] is None  # no default anywhere: every tool
    GroupDefaults.objects.create(group=team, tools=["tests__echo"])
    assert client.get("/api/tools").json()["chosen"] == ["tests__echo"]
    saved = client.put(
        "/api/defaults", json.dumps({"model": "", "tools": ["tests__add", "tests__echo"]}),
        content_type="application/json",
    )  # fmt: skip
    assert saved.status_code == 200 and saved.json()["tools"] == ["tests__add", "tests__echo"]
    assert client.get("/api/tools").json()["chosen"] == ["tests__add", "tests__echo"]
    # A save without `tools` (the form when they were not touched) keeps them; null hands back to the group.
    client.put("/api/defaults", json.dumps({"model": ""}), content_type="application/json")
    assert ChatDefaults.objects.get(user=alice).tools == ["tests__add", "tests__echo"]
    client.put("/api/defaults", json.dumps({"model": "", "tools": None}), content_type="application/json")
    assert client.get("/api/tools").json()["chosen"] == ["tests__echo"]
    bad = client.put("/api/defaults", json.dumps({"tools": "tests__echo"}), content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_field"


async def test_a_new_chat_offers_the_default_tools_and_a_chosen_set_wins(
    connect, alice, team, tools_server, tool_providers, fake
):
    await team.user_set.aadd(alice)
    await GroupDefaults.objects.acreate(group=team, tools=["tests__echo"])
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=ECHO, model=MODELS["i14"])
    done = (await ws.until("done"))[-1]
    assert offered(fake) == ["tests__echo"]  # the group's default
    # The person's own default comes first.
    await ChatDefaults.objects.acreate(user=alice, tools=["tests__add"])
    await ws.send(type="send", conversation=None, content="hello", model=MODELS["i14"])
    await ws.until("done")
    assert offered(fake) == ["tests__add"]
    # A chat's own choice beats both, and a conversation keeps the tools it started with.
    await ws.send(type="send", conversation=None, content="hello", model=MODELS["i14"],
                  tools=["tests__echo", "tests__add"])  # fmt: skip
    await ws.until("done")
    assert offered(fake) == ["tests__add", "tests__echo"]
    await ws.send(type="send", conversation=done["conversation"], content="again")
    await ws.until("done")
    assert offered(fake) == ["tests__echo"]
    menu = await sync_to_async(lambda: signed_in(alice).get("/api/tools").json())()
    assert menu["chosen"] == ["tests__add"]
