"""Prompt presets and personal defaults: the JSON API (own only, staff publish) and a new chat's defaults."""

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from chat.models import ChatDefaults, Conversation, PromptPreset
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)


def client_for(user, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def call(client, method: str, path: str, body=None):
    send = getattr(client, method)
    return send(path, json.dumps(body), content_type="application/json") if body is not None else send(path)


def test_presets_are_private_to_their_owner(alice, bob):
    mine = client_for(alice)
    made = call(mine, "post", "/api/presets", {
        "name": " Review ", "text": "Review this code:", "system_prompt": "You are terse.",
        "model": "i14/x", "params": {"temperature": 0.2, "max_tokens": 300},
    })  # fmt: skip
    assert made.status_code == 201
    preset = made.json()
    assert preset | {"id": 0} == {
        "id": 0, "name": "Review", "text": "Review this code:", "system_prompt": "You are terse.", "model": "i14/x",
        "params": {"temperature": 0.2, "max_tokens": 300}, "published": False, "mine": True, "owner": None,
    }  # fmt: skip
    url = f"/api/presets/{preset['id']}"
    assert [p["id"] for p in call(mine, "get", "/api/presets").json()["presets"]] == [preset["id"]]

    theirs = client_for(bob)
    assert call(theirs, "get", "/api/presets").json()["presets"] == []
    assert call(theirs, "get", url).status_code == 404
    assert call(theirs, "patch", url, {"name": "Mine now"}).status_code == 404
    assert call(theirs, "delete", url).status_code == 404
    assert PromptPreset.objects.get().name == "Review"

    assert call(mine, "patch", url, {"text": "  "}).json()["error"]["code"] == "bad_field"
    changed = call(mine, "patch", url, {"name": "Code review", "params": {"temperature": None, "max_tokens": 300}})
    assert changed.status_code == 200 and changed.json()["name"] == "Code review"
    assert changed.json()["params"] == {"max_tokens": 300}
    assert call(mine, "delete", url).status_code == 204
    assert not PromptPreset.objects.exists()


@pytest.mark.parametrize(
    "body, code",
    [
        ({"text": "no name"}, "bad_field"),
        ({"name": "x" * 101, "text": "t"}, "bad_field"),
        ({"name": "empty"}, "bad_field"),
        ({"name": "p", "text": "t", "params": {"temperature": 3}}, "bad_param"),
        ({"name": "p", "text": "t", "params": {"seed": 1}}, "bad_param"),
        ({"name": "p", "text": "t", "system_prompt": "s" * 20_001}, "bad_field"),
        ({"name": "p", "text": "t", "published": "yes"}, "bad_field"),
    ],
)
def test_a_bad_preset_is_refused_with_a_reason(alice, body, code):
    response = call(client_for(alice), "post", "/api/presets", body)
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert not PromptPreset.objects.exists()


@pytest.mark.parametrize(
    "body, english, french",
    [
        ({"params": {"max_tokens": 99999999}}, "`max_tokens` must be an integer from 1 to 32768.",
         "`max_tokens` doit être un entier de 1 à 32768."),
        ({"params": {"temperature": 3}}, "`temperature` must be a number from 0 to 2.",
         "`temperature` doit être un nombre de 0 à 2."),
        ({"system_prompt": "s" * 20_001}, "`system_prompt` must be a string of at most 20000 characters.",
         "`system_prompt` doit être une chaîne d’au plus 20000 caractères."),
    ],
)  # fmt: skip
def test_a_bad_preset_setting_is_explained_in_the_persons_language(alice, body, english, french):
    client = client_for(alice)
    preset = {"name": "p", "text": "t", **body}
    assert call(client, "post", "/api/presets", preset).json()["error"]["detail"] == english
    client.cookies["django_language"] = "fr"
    assert call(client, "post", "/api/presets", preset).json()["error"]["detail"] == french


def test_a_bad_default_is_explained_in_the_persons_language(alice):
    client = client_for(alice)
    client.cookies["django_language"] = "fr"
    hot = call(client, "put", "/api/defaults", {"temperature": 3}).json()["error"]["detail"]
    assert hot == "`temperature` doit être un nombre de 0 à 2."
    long = call(client, "put", "/api/defaults", {"system_prompt": "s" * 20_001}).json()["error"]["detail"]
    assert long == "`system_prompt` doit être une chaîne d’au plus 20000 caractères."


def test_only_staff_publish_and_published_presets_are_read_only_for_everyone(alice, bob, django_user_model):
    assert (
        call(client_for(alice), "post", "/api/presets", {"name": "p", "text": "t", "published": True}).status_code
        == 403
    )
    staff = django_user_model.objects.create_user("carol", password="carol-secret-pw", is_staff=True)
    made = call(
        client_for(staff), "post", "/api/presets", {"name": "Team tone", "text": "Write kindly", "published": True}
    )
    assert made.status_code == 201 and made.json()["published"] is True
    url = f"/api/presets/{made.json()['id']}"
    seen = call(client_for(bob), "get", "/api/presets").json()["presets"]
    assert [(p["name"], p["mine"], p["owner"]) for p in seen] == [("Team tone", False, "carol")]
    assert call(client_for(bob), "get", url).status_code == 200
    assert call(client_for(bob), "patch", url, {"text": "Write rudely"}).status_code == 404
    assert call(client_for(bob), "delete", url).status_code == 404
    assert PromptPreset.objects.get().text == "Write kindly"


def test_changes_need_the_csrf_token_and_a_session(alice):
    assert call(client_for(alice, csrf=True), "post", "/api/presets", {"name": "p", "text": "t"}).status_code == 403
    assert call(client_for(alice, csrf=True), "put", "/api/defaults", {"temperature": 1}).status_code == 403
    assert call(Client(), "get", "/api/presets").status_code == 401
    assert call(Client(), "get", "/api/defaults").status_code == 401


def test_defaults_are_read_and_replaced(alice):
    mine = client_for(alice)
    empty = {"model": "", "temperature": None, "system_prompt": "", "tools": None}
    assert call(mine, "get", "/api/defaults").json() == empty
    body = {"model": "api14/openai/gpt-5-mini", "temperature": 0.3, "system_prompt": "Answer in French.", "tools": None}
    assert call(mine, "put", "/api/defaults", body).json() == body
    assert call(mine, "get", "/api/defaults").json() == body
    bad = call(mine, "put", "/api/defaults", {"temperature": 9})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_param"
    assert call(mine, "put", "/api/defaults", {}).json() == empty


async def test_a_new_chat_without_its_own_settings_uses_the_persons_defaults(connect, alice, providers, fake):
    await ChatDefaults.objects.acreate(
        user=alice, model="api14/openai/gpt-5-mini", temperature=0.3, system_prompt="Answer in French."
    )
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="Hello")
    started = (await ws.until("done"))[0]
    body = fake.app.last().body
    assert started["model"] == MODELS["api14"] and body["model"] == MODELS["api14"]
    assert body["temperature"] == 0.3
    assert body["messages"][0] == {"role": "system", "content": "Answer in French."}
    conversation = await Conversation.objects.aget(pk=started["conversation"])
    assert conversation.system_prompt == "Answer in French." and conversation.params == {"temperature": 0.3}

    # A chat's own values win; a later message of a conversation does not take the defaults again.
    await ws.send(type="send", conversation=None, content="Hi", model=MODELS["i14"], system_prompt="Be brief.",
                  params={"temperature": 1.1})  # fmt: skip
    started = (await ws.until("done"))[0]
    body = fake.app.last().body
    assert body["model"] == MODELS["i14"] and body["temperature"] == 1.1
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    await sync_to_async(ChatDefaults.objects.filter(user=alice).update)(temperature=0.9)
    await ws.send(type="send", conversation=started["conversation"], content="More")
    await ws.until("done")
    assert fake.app.last().body["temperature"] == 1.1


async def test_a_default_model_no_longer_offered_falls_back_to_the_site_default(connect, alice, providers, fake):
    await ChatDefaults.objects.acreate(user=alice, model="gone/model")
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="Hello")
    started = (await ws.until("done"))[0]
    assert started["model"] == MODELS["i14"] and fake.app.last().body["model"] == MODELS["i14"]


def test_staff_see_and_publish_presets_in_the_admin(alice, django_user_model):
    """Staff publish a preset of their own; someone else's stays theirs (tests/wiring/test_admin.py)."""
    stella = django_user_model.objects.create_superuser("stella", password="stella-secret-pw")
    preset = PromptPreset.objects.create(owner=stella, name="Summary", text="Summarise:")
    admin = client_for(stella)
    listing = admin.get("/admin/chat/promptpreset/")
    assert listing.status_code == 200 and "Summary" in listing.content.decode()
    form = admin.get(f"/admin/chat/promptpreset/{preset.pk}/change/")
    assert form.status_code == 200
    response = admin.post(f"/admin/chat/promptpreset/{preset.pk}/change/", {
        "owner": stella.pk, "name": "Summary", "text": "Summarise:", "system_prompt": "", "model": "",
        "params": "{}", "published": "on", "updated_0": "2026-11-30", "updated_1": "12:00:00",
    })  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    preset.refresh_from_db()
    assert preset.published
    assert call(client_for(alice), "get", "/api/presets").json()["presets"][0]["published"] is True
    assert admin.get("/admin/chat/chatdefaults/").status_code == 200
