"""The message tree over the websocket: regenerate and edit make siblings, switch, continue, delete a pair.

Each path's history is checked where it lands: at the fake upstream.
"""

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from chat.actions.orphans import recover_orphans
from chat.actions.turns import CONTINUE_PROMPT
from chat.models import Conversation, Message, Usage
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]
INFYRENCE = MODELS["infyrence"]  # no reasoning: max_tokens cuts the answer itself
SLOW = "[[delay:20]] [[chunks:400]]"


def sent(fake) -> list[tuple[str, str]]:
    """The history of the last request the fake upstream received, as (role, content)."""
    return [(m["role"], m["content"]) for m in fake.app.last().body["messages"]]


async def turn(ws, **frame) -> list[dict]:
    await ws.send(**frame)
    frames = await ws.until("done")
    assert frames[0]["type"] == "started", frames
    return frames


async def named(pk: int, content: str) -> None:
    """Give an answer a text of its own (echoed answers are alike), so each path is told apart upstream."""
    await Message.objects.filter(pk=pk).aupdate(content=content)


@sync_to_async
def shown(user, conversation: int) -> dict:
    client = Client()
    client.force_login(user)
    response = client.get(f"/api/conversations/{conversation}")
    assert response.status_code == 200
    return response.json()


async def test_regenerate_twice_makes_siblings_and_switch_picks_the_history(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    first = await turn(ws, type="send", conversation=None, content="[[echo]] question", model=I14)
    conversation, asked = first[0]["conversation"], first[0]["user_message"]
    second = await turn(ws, type="regenerate", conversation=conversation)
    third = await turn(ws, type="regenerate", conversation=conversation, message=second[0]["message"])
    answers = [frames[0]["message"] for frames in (first, second, third)]
    assert len(set(answers)) == 3 and {f[0]["user_message"] for f in (second, third)} == {asked}
    assert sent(fake) == [("user", "[[echo]] question")]  # never an older answer with it
    for number, pk in enumerate(answers, 1):
        await named(pk, f"answer {number}")
    # Three answers kept, each with its own usage row; the newest is shown.
    assert await Message.objects.filter(parent_id=asked).acount() == 3
    assert await Usage.objects.filter(message_id__in=answers).acount() == 3
    data = await shown(alice, conversation)
    assert [m["id"] for m in data["messages"]] == [asked, answers[2]] and data["current"] == answers[2]
    assert data["messages"][1]["siblings"] == answers and data["messages"][0]["siblings"] == [asked]

    await ws.send(type="switch", message=answers[0])
    switched = await ws.receive()
    assert switched == {"type": "switched", "conversation": conversation, "message": answers[0], "current": answers[0]}
    assert [m["id"] for m in (await shown(alice, conversation))["messages"]] == [asked, answers[0]]
    await turn(ws, type="send", conversation=conversation, content="[[echo]] next")
    assert sent(fake) == [("user", "[[echo]] question"), ("assistant", "answer 1"), ("user", "[[echo]] next")]

    # Switching to the second answer shows its branch (no follow-up there) and sends that history.
    await ws.send(type="switch", message=answers[1])
    assert (await ws.receive())["current"] == answers[1]
    await turn(ws, type="send", conversation=conversation, content="[[echo]] other")
    assert sent(fake) == [("user", "[[echo]] question"), ("assistant", "answer 2"), ("user", "[[echo]] other")]
    # Back to the first answer: the branch goes on to its newest follow-up, as it was left.
    await ws.send(type="switch", message=answers[0])
    current = (await ws.receive())["current"]
    data = await shown(alice, conversation)
    assert [m["content"] for m in data["messages"]][:3] == ["[[echo]] question", "answer 1", "[[echo]] next"]
    assert data["messages"][-1]["id"] == current == data["current"]
    assert data["messages"][1]["siblings"] == answers


async def test_edit_a_middle_message_makes_a_branch_and_keeps_the_old_one(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    frames = [await turn(ws, type="send", conversation=None, content="[[echo]] one", model=I14)]
    conversation = frames[0][0]["conversation"]
    for word in ("two", "three"):
        frames.append(await turn(ws, type="send", conversation=conversation, content=f"[[echo]] {word}"))
    asked = [f[0]["user_message"] for f in frames]
    answered = [f[0]["message"] for f in frames]
    for number, pk in enumerate(answered, 1):
        await named(pk, f"answer {number}")

    edited = await turn(ws, type="edit", message=asked[1], content="[[echo]] two, better")
    new_question, new_answer = edited[0]["user_message"], edited[0]["message"]
    assert new_question not in asked and edited[0]["continued"] is False
    assert sent(fake) == [("user", "[[echo]] one"), ("assistant", "answer 1"), ("user", "[[echo]] two, better")]
    edit = await Message.objects.aget(pk=new_question)
    assert edit.parent_id == answered[0] and edit.content == "[[echo]] two, better"
    old = await Message.objects.aget(pk=asked[1])
    assert old.content == "[[echo]] two" and await Message.objects.filter(conversation_id=conversation).acount() == 8
    data = await shown(alice, conversation)
    assert [m["id"] for m in data["messages"]] == [asked[0], answered[0], new_question, new_answer]
    assert data["messages"][2]["siblings"] == [asked[1], new_question]

    # The old branch is there whole: switching to the old question shows it down to its last answer.
    await ws.send(type="switch", message=asked[1])
    assert (await ws.receive())["current"] == answered[2]
    await turn(ws, type="send", conversation=conversation, content="[[echo]] four")
    assert sent(fake) == [
        ("user", "[[echo]] one"), ("assistant", "answer 1"), ("user", "[[echo]] two"), ("assistant", "answer 2"),
        ("user", "[[echo]] three"), ("assistant", "answer 3"), ("user", "[[echo]] four"),
    ]  # fmt: skip
    # An edit of the first message is a second root.
    root = await turn(ws, type="edit", message=asked[0], content="[[echo]] one again")
    assert sent(fake) == [("user", "[[echo]] one again")]
    assert (await Message.objects.aget(pk=root[0]["user_message"])).parent_id is None


async def test_switching_back_shows_the_branch_below_as_it_was_last_chosen(connect, alice, providers):
    _, _, ws = await connect(alice)
    first = await turn(ws, type="send", conversation=None, content="[[echo]] one", model=I14)
    conversation = first[0]["conversation"]
    older = await turn(ws, type="send", conversation=conversation, content="[[echo]] two")
    newer = await turn(ws, type="regenerate", conversation=conversation)
    await ws.send(type="switch", message=older[0]["message"])  # the older answer, chosen last
    assert (await ws.receive())["current"] == older[0]["message"]
    await turn(ws, type="edit", message=first[0]["user_message"], content="[[echo]] one, again")
    # Back to the first version: below it, the answer chosen last, not the newest one.
    await ws.send(type="switch", message=first[0]["user_message"])
    assert (await ws.receive())["current"] == older[0]["message"] != newer[0]["message"]


async def test_continue_appends_to_a_cut_answer_with_a_follow_up_turn(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    params = {"max_tokens": 6}
    cut = await turn(ws, type="send", conversation=None, content="Tell me a story", model=INFYRENCE, params=params)
    conversation, reply = cut[0]["conversation"], cut[0]["message"]
    assert cut[-1]["finish_reason"] == "length" and cut[-1]["status"] == "complete"
    before = (await Message.objects.aget(pk=reply)).content
    data = await shown(alice, conversation)
    assert data["messages"][-1]["continuable"] is True and data["messages"][0]["continuable"] is False

    more = await turn(ws, type="continue", message=reply)
    assert more[0]["message"] == reply and more[0]["continued"] is True
    assert more[0]["user_message"] == cut[0]["user_message"]
    # No assistant prefill (the providers document none): the cut answer, then a turn asking for the rest.
    assert sent(fake) == [("user", "Tell me a story"), ("assistant", before), ("user", CONTINUE_PROMPT)]
    assert fake.app.last().body["max_tokens"] == 6
    added = "".join(f.get("content", "") for f in more if f["type"] == "delta")
    answer = await Message.objects.aget(pk=reply)
    assert added and answer.content == before + added and answer.status == "complete"
    # A usage row per stream; the answer shows their sum.
    rows = [row async for row in Usage.objects.filter(message_id=reply).order_by("started")]
    assert len(rows) == 2 and rows[1].completion_tokens == more[-1]["usage"]["completion_tokens"]
    usage = (await shown(alice, conversation))["messages"][-1]["usage"]
    assert usage["completion_tokens"] == rows[0].completion_tokens + rows[1].completion_tokens
    assert await Message.objects.filter(conversation_id=conversation).acount() == 2  # no "Continue" stored
    assert (await Conversation.objects.aget(pk=conversation)).current_id == reply


async def test_continue_after_a_stop_and_what_is_refused(connect, alice, bob, providers, fake):
    _, _, ws = await connect(alice)
    done = await turn(ws, type="send", conversation=None, content="[[echo]] whole", model=I14)
    await ws.send(type="continue", message=done[0]["message"])
    assert (await ws.receive())["code"] == "not_continuable"  # it ended by itself
    await ws.send(type="send", conversation=done[0]["conversation"], content=SLOW)
    started = (await ws.until("delta"))[0]
    await ws.send(type="continue", message=started["message"])
    assert (await ws.until("error"))[-1]["code"] == "busy"
    await ws.send(type="stop", message=started["message"])
    stopped = await ws.until("done")
    assert stopped[-1]["status"] == "stopped"
    stopped_answer = await Message.objects.aget(pk=started["message"])
    text, thought = stopped_answer.content, stopped_answer.reasoning
    _, _, intruder = await connect(bob)
    await intruder.send(type="continue", message=started["message"])
    assert (await intruder.receive())["code"] == "not_found"
    await ws.send(type="continue", message=done[0]["message"])
    assert (await ws.receive())["code"] == "not_current"
    await ws.send(type="continue", message="x")
    assert (await ws.receive())["code"] == "bad_field"

    await turn(ws, type="continue", message=started["message"])
    answer = await Message.objects.aget(pk=started["message"])
    assert answer.content.startswith(text) and len(answer.content) > len(text) and answer.status == "complete"
    assert thought and answer.reasoning.startswith(thought) and len(answer.reasoning) > len(thought)  # i14 thinks again


async def test_delete_a_pair_keeps_what_followed(connect, alice, bob, providers, fake):
    _, _, ws = await connect(alice)
    frames = [await turn(ws, type="send", conversation=None, content="[[echo]] one", model=I14)]
    conversation = frames[0][0]["conversation"]
    for word in ("two", "three"):
        frames.append(await turn(ws, type="send", conversation=conversation, content=f"[[echo]] {word}"))
    asked = [f[0]["user_message"] for f in frames]
    answered = [f[0]["message"] for f in frames]
    again = await turn(ws, type="regenerate", conversation=conversation, message=answered[1])  # a second answer
    await ws.send(type="switch", message=answered[1])
    assert (await ws.receive())["current"] == answered[2]

    _, _, intruder = await connect(bob)
    await intruder.send(type="delete", message=asked[1])
    assert (await intruder.receive())["code"] == "not_found"
    await ws.send(type="delete", message=answered[1])  # the answer names its pair
    deleted = await ws.receive()
    assert deleted == {"type": "deleted", "conversation": conversation, "message": answered[1], "current": answered[2]}
    assert not await Message.objects.filter(pk__in=[asked[1], answered[1], again[0]["message"]]).aexists()
    assert (await Message.objects.aget(pk=asked[2])).parent_id == answered[0]
    assert await Usage.objects.filter(message__isnull=True).acount() == 2  # kept, unlinked
    data = await shown(alice, conversation)
    assert [m["id"] for m in data["messages"]] == [asked[0], answered[0], asked[2], answered[2]]
    await turn(ws, type="send", conversation=conversation, content="[[echo]] four")
    assert [content for _, content in sent(fake)] == ["[[echo]] one", "one", "[[echo]] three", "three", "[[echo]] four"]

    # The last pair: the one before it is shown. Refused while an answer streams.
    last = await Message.objects.filter(conversation_id=conversation).alast()
    await ws.send(type="send", conversation=conversation, content=SLOW)
    streaming = (await ws.until("delta"))[0]["message"]
    await ws.send(type="delete", message=streaming)
    assert (await ws.until("error"))[-1]["code"] == "busy"
    await ws.send(type="stop", message=streaming)
    await ws.until("done")
    await ws.send(type="delete", message=streaming)
    assert (await ws.until("deleted"))[-1]["current"] == last.pk
    await ws.send(type="delete", message=asked[0])  # the first pair: what followed becomes the root
    assert (await ws.until("deleted"))[-1]["current"] == last.pk
    assert (await Message.objects.aget(pk=asked[2])).parent_id is None


async def test_switch_refuses_bad_ids_others_and_a_streaming_conversation(connect, alice, bob, providers):
    _, _, ws = await connect(alice)
    frames = await turn(ws, type="send", conversation=None, content="[[echo]] mine", model=I14)
    _, _, intruder = await connect(bob)
    await intruder.send(type="switch", message=frames[0]["message"])
    assert (await intruder.receive())["code"] == "not_found"
    await ws.send(type="switch", message=0)
    assert (await ws.receive())["code"] == "bad_field"
    await ws.send(type="regenerate", conversation=frames[0]["conversation"], message=frames[0]["message"] + 100)
    assert (await ws.receive())["code"] == "not_found"  # an answer of no conversation of hers
    await ws.send(type="delete", message=frames[0]["message"] + 100)
    assert (await ws.receive())["code"] == "not_found"
    await ws.send(type="send", conversation=frames[0]["conversation"], content=SLOW)
    streaming = (await ws.until("delta"))[0]["message"]
    await ws.send(type="switch", message=frames[0]["message"])
    assert (await ws.until("error"))[-1]["code"] == "busy"
    await ws.send(type="stop", message=streaming)
    await ws.until("done")


@pytest.mark.parametrize("storage", ["database", "files"])
def test_an_edited_messages_attachments_are_copies_that_outlive_the_original(alice, tmp_path, settings, storage):
    from chat.models import Attachment
    from tests import files
    from tests.views.test_attachments import make

    settings.ATTACHMENT_STORAGE = storage
    settings.STORAGES = {
        **settings.STORAGES,
        "attachments": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": tmp_path}},
    }
    conversation = Conversation.objects.create(owner=alice, title="t")
    original = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="see")
    picture = make(alice, "photo.png", files.image(20, 20), original)
    sibling = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="look")
    Attachment.objects.copy_to(sibling, original.attachments.all())
    copy = sibling.attachments.get()
    assert copy.pk != picture.pk and copy.name == "photo.png" and copy.read() == picture.read()
    assert (copy.path != picture.path) if storage == "files" else (copy.path == "" and copy.data is not None)
    data = picture.read()
    original.delete()  # one branch goes: the other's file stays
    assert Attachment.objects.get().read() == data
    conversation.delete()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_an_orphaned_continuation_is_metered_for_its_own_text_only(alice):
    conversation = Conversation.objects.create(owner=alice, title="t")
    asked = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="go")
    answer = Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, parent=asked, status=Message.Status.STREAMING,
        content="x" * 400,  # 200 characters from the first stream (50 tokens), 200 from the continuation
    )  # fmt: skip
    Usage.objects.create(user=alice, message=answer, model="m", status="complete", completion_tokens=50)
    Usage.objects.create(user=alice, message=answer, model="m", status="streaming", prompt_tokens=70)
    assert [m.pk for m in recover_orphans(None)] == [answer.pk]
    continuation = Usage.objects.get(message=answer, status="interrupted")
    assert continuation.completion_tokens == 50 and continuation.total_tokens == 120 and continuation.estimated
