"""Groups decide who may use which model (chat/models/access.py): the page's list, the websocket, /v1.

The fixture limits the infyrence provider's whole list and one api14 model to the group
"research"; bob is in it, alice is not.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group

from chat.models import ApiToken, Conversation, GroupDefaults, ModelAccess, Provider, Usage
from tests.conftest import FAKE_KEY, MODELS, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]
MINI = "openai/gpt-5-mini"
R1 = "deepseek/deepseek-r1"
CLAUDE = "claude-sonnet-5"
EVERY = {I14, MINI, R1, CLAUDE, "gpt-4.1-mini"}
OPEN = {I14, R1}  # what alice, in no group, may use
# The embedding models (api14's open, infyrence's the group's): listed on /v1, never in the page's picker.
EMBEDDING_API14, EMBEDDING_INFYRENCE = "openai/text-embedding-3-small", "text-embedding-3-small"


@pytest.fixture
def research(providers, bob):
    group = Group.objects.create(name="research")
    bob.groups.add(group)
    for provider, model in ((providers["infyrence"], ""), (providers["api14"], MINI)):
        ModelAccess.objects.create(provider=provider, model=model).groups.add(group)
    return group


def sdk(server, user) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=ApiToken.issue(user, "t")[1], max_retries=0, timeout=30)


def ask(client: openai.OpenAI, model: str) -> bool:
    """Whether a completion on `model` came back (an error raises)."""
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=50)
    return answer.object == "chat.completion" and answer.choices[0].finish_reason is not None


# --- /v1 -----------------------------------------------------------------------------


def test_v1_models_lists_only_the_persons_models(server, research, alice, bob, admin_user):
    every = EVERY | {EMBEDDING_API14, EMBEDDING_INFYRENCE}
    assert {model.id for model in sdk(server, alice).models.list()} == OPEN | {EMBEDDING_API14}
    assert {model.id for model in sdk(server, bob).models.list()} == every
    assert {model.id for model in sdk(server, admin_user).models.list()} == every  # a superuser, in no group


@pytest.mark.parametrize("model", [MINI, CLAUDE, "infyrence/gpt-4.1-mini"])
def test_v1_refuses_a_model_of_another_group_with_403_in_openais_shape(server, research, alice, bob, fake, model):
    client = sdk(server, alice)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        ask(client, model)
    assert refused.value.status_code == 403
    assert refused.value.body["code"] == "model_not_allowed" and refused.value.body["type"] == "permission_error"
    assert not fake.app.streams  # nothing went upstream
    assert ask(client, R1)  # an open model of the same provider works
    assert ask(sdk(server, bob), model)


def test_leaving_the_group_takes_the_model_away_at_the_next_request(server, research, bob):
    client = sdk(server, bob)
    assert ask(client, CLAUDE)
    bob.groups.remove(research)
    with pytest.raises(openai.PermissionDeniedError):
        ask(client, CLAUDE)


# --- the page's list and the websocket ---------------------------------------------------


def test_the_pages_model_list_has_only_the_persons_models(server, research, alice, bob):
    def listed(user):
        cookies = {"sessionid": session_cookie(user)}
        return httpx.get(server.url + "/api/models", cookies=cookies).json()

    mine = listed(alice)
    assert {entry["id"] for entry in mine["models"]} == OPEN and mine["default"] == f"i14/{I14}"
    assert {entry["id"] for entry in listed(bob)["models"]} == EVERY


async def test_the_socket_refuses_a_model_of_another_group(connect, research, alice, bob, fake):
    _, _, ws = await connect(alice)
    for model in (CLAUDE, f"api14/{MINI}"):
        await ws.send(type="send", conversation=None, content="hi", model=model)
        refused = await ws.receive()
        assert refused["type"] == "error" and refused["code"] == "model_not_allowed", refused
    assert not fake.app.streams and not await Conversation.objects.filter(owner=alice).aexists()
    await ws.send(type="send", conversation=None, content="hi", model=R1)
    assert (await ws.until("done"))[-1]["status"] == "complete"
    _, _, theirs = await connect(bob)
    await theirs.send(type="send", conversation=None, content="hi", model=CLAUDE)
    assert (await theirs.until("done"))[-1]["status"] == "complete"


async def test_a_conversation_on_a_model_taken_away_is_refused_on_regenerate(connect, research, bob, fake):
    _, _, ws = await connect(bob)
    await ws.send(type="send", conversation=None, content="hi", model=CLAUDE)
    conversation = (await ws.until("done"))[0]["conversation"]
    await sync_to_async(bob.groups.remove)(research)
    await ws.send(type="regenerate", conversation=conversation)
    assert (await ws.receive())["code"] == "model_not_allowed"


# --- per-group defaults -------------------------------------------------------------------


async def test_a_new_chat_gets_the_groups_default_model_and_system_prompt(connect, research, bob, alice, fake):
    await GroupDefaults.objects.acreate(group=research, default_model=f"infyrence/{CLAUDE}", system_prompt="Be terse.")
    _, _, ws = await connect(bob)
    await ws.send(type="send", conversation=None, content="[[echo]] hi")
    frames = await ws.until("done")
    assert frames[0]["model"] == CLAUDE and frames[0]["provider"] == "infyrence"
    assert fake.app.last().body["messages"][0] == {"role": "system", "content": "Be terse."}
    # A system prompt of the chat's own wins over the group's.
    await ws.send(type="send", conversation=None, content="hi", system_prompt="Be long.")
    await ws.until("done")
    assert fake.app.last().body["messages"][0] == {"role": "system", "content": "Be long."}
    # Outside the group: the site's default, no system prompt.
    _, _, other = await connect(alice)
    await other.send(type="send", conversation=None, content="hi")
    frames = await other.until("done")
    assert frames[0]["model"] == I14 and fake.app.last().body["messages"][0]["role"] == "user"


def test_the_pages_default_is_the_groups(server, research, bob):
    GroupDefaults.objects.create(group=research, default_model=f"api14/{MINI}")
    listed = httpx.get(server.url + "/api/models", cookies={"sessionid": session_cookie(bob)}).json()
    assert listed["default"] == f"api14/{MINI}"


def test_v1_a_plain_id_two_providers_list_goes_to_the_one_the_person_may_use(server, providers, alice, bob, fake):
    """/v1/models lists a plain id under the provider the person may use; a request naming it goes there,
    not to the first provider listing it (refused with 403 before)."""
    research = Group.objects.create(name="research")
    bob.groups.add(research)
    ModelAccess.objects.create(provider=providers["infyrence"], model="").groups.add(research)
    second = Provider.objects.create(name="second", base_url=fake.base_url("infyrence"), api_key=FAKE_KEY)
    client = sdk(server, alice)
    assert {(m.id, m.owned_by) for m in client.models.list() if m.id == CLAUDE} == {(CLAUDE, "second")}
    assert ask(client, CLAUDE)
    assert Usage.objects.filter(user=alice).get().provider == second
    assert ask(sdk(server, bob), CLAUDE)  # bob may use both: the first listing it
    assert Usage.objects.filter(user=bob).get().provider == providers["infyrence"]
