"""Share links, export and import over HTTP: who may open a link, revoking, the round trip, refusals."""

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from chat.actions import exports, imports
from chat.models import Conversation, ConversationRead, Message, Share, Usage

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client(enforce_csrf_checks=False)
    client.force_login(user)
    return client


@pytest.fixture
def tree(alice):
    """Question, two answers (a regenerated sibling), an edited question with its answer; the last branch shown."""
    c = Conversation.objects.create(
        owner=alice, title="Ocean poem", system_prompt="Be brief", params={"temperature": 0.5}
    )
    ask = Message.objects.create(conversation=c, role="user", content="Write about the sea")
    first = Message.objects.create(conversation=c, parent=ask, role="assistant", content="Waves", status="stopped",
                                   model="m", reasoning="hmm")  # fmt: skip
    Usage.objects.create(user=alice, message=first, model="m", status="stopped", prompt_tokens=3, completion_tokens=4)
    second = Message.objects.create(conversation=c, parent=ask, role="assistant", content="Tides **roll**", model="m")
    Usage.objects.create(user=alice, message=second, model="m", status="complete", prompt_tokens=3, completion_tokens=9)
    follow = Message.objects.create(conversation=c, parent=second, role="user", content="Shorter")
    last = Message.objects.create(conversation=c, parent=follow, role="assistant", content="Tides.", model="m")
    c.current = last
    c.save()
    return c


def read(response) -> bytes:
    """An export's body: written to the download as it is read (a streaming response)."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def share(client, conversation, **options):
    return client.post(f"/api/conversations/{conversation.pk}/shares", options, content_type="application/json")


def test_a_link_opens_for_a_teammate_and_not_for_an_anonymous_visitor(alice, bob, tree):
    made = share(client_for(alice), tree)
    assert made.status_code == 201
    url = made.json()["url"]
    assert url.startswith("/s/") and len(url) > 30  # 24 random bytes
    page = client_for(bob).get(url)
    assert page.status_code == 200 and page["X-Robots-Tag"].startswith("noindex")
    shown = page.context["content"]
    assert [m["content"] for m in shown["messages"]] == ["Write about the sea", "Tides **roll**", "Shorter", "Tides."]
    assert all(m["usage"] is None for m in shown["messages"])  # no usage unless the owner chooses
    assert "system_prompt" not in shown and "Be brief" not in page.content.decode()  # the owner's instructions
    assert ConversationRead.objects.filter(conversation=tree, reader=bob, where="share link").count() == 1
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous.url.startswith("/accounts/login/")
    assert Client().get("/s/not-a-real-token/").status_code == 404
    assert client_for(bob).get(f"/api/conversations/{tree.pk}/shares").status_code == 404  # bob may not list them


def test_continuing_from_a_link_without_opening_it_is_recorded(alice, bob, tree):
    url = share(client_for(alice), tree).json()["url"]
    copied = client_for(bob).post(url + "continue")  # no GET of the shared page first
    assert copied.status_code == 302
    assert Conversation.objects.filter(owner=bob).count() == 1
    read = ConversationRead.objects.get()
    assert (read.conversation, read.reader, read.where) == (tree, bob, "share link, continued")


def test_a_shared_page_speaks_the_readers_language(alice, bob, tree):
    url = share(client_for(alice), tree).json()["url"]
    page = client_for(bob).get(url, headers={"Accept-Language": "fr"}).content.decode()
    assert "Chat d’équipe" in page and "Team chat" not in page


def test_public_links_only_where_the_setting_allows_them(alice, tree, settings):
    settings.CHAT_PUBLIC_SHARES = False
    refused = share(client_for(alice), tree, public=True)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "public_shares_off"
    settings.CHAT_PUBLIC_SHARES = True
    url = share(client_for(alice), tree, public=True, show_usage=True).json()["url"]
    team_only = share(client_for(alice), tree).json()["url"]
    page = Client().get(url)
    assert page.status_code == 200
    assert [m["usage"] and m["usage"]["completion_tokens"] for m in page.context["content"]["messages"]][1] == 9
    assert Client().get(team_only).status_code == 302
    settings.CHAT_PUBLIC_SHARES = False  # turned off later: public links are for signed-in people again
    assert Client().get(url).status_code == 302


def test_a_snapshot_keeps_what_was_shared_and_a_live_link_follows(alice, bob, tree):
    owner = client_for(alice)
    snapshot = share(owner, tree).json()["url"]
    live = share(owner, tree, live=True).json()["url"]
    Message.objects.filter(content="Tides.").update(content="Changed since")
    Conversation.objects.filter(pk=tree.pk).update(title="Renamed")
    reader = client_for(bob)
    assert reader.get(snapshot).context["content"]["messages"][-1]["content"] == "Tides."
    assert reader.get(snapshot).context["content"]["title"] == "Ocean poem"
    assert reader.get(live).context["content"]["messages"][-1]["content"] == "Changed since"


def test_the_owner_lists_and_revokes_links_and_a_revoked_link_is_404(alice, bob, tree):
    owner = client_for(alice)
    made = share(owner, tree).json()
    listed = owner.get("/api/shares").json()["shares"]
    assert [(s["id"], s["title"]) for s in listed] == [(made["id"], "Ocean poem")]
    assert client_for(bob).delete(f"/api/shares/{made['id']}").status_code == 404  # not bob's to revoke
    assert owner.delete(f"/api/shares/{made['id']}").status_code == 204
    assert client_for(bob).get(made["url"]).status_code == 404
    assert not Share.objects.exists()


def test_sharing_needs_the_csrf_token(alice, tree):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert share(client, tree).status_code == 403


def shape(conversation: Conversation) -> dict:
    """The tree without ids: each message by its path of positions, the branch shown by its path."""
    data = exports.tree_json(conversation)
    by_id = {m["id"]: m for m in data["messages"]}

    def key(pk):
        trail = []
        while pk is not None:
            trail.append((by_id[pk]["role"], by_id[pk]["content"]))
            pk = by_id[pk]["parent"]
        return tuple(reversed(trail))

    drop = {"id", "parent", "created"}
    return {
        "head": {k: data[k] for k in ("title", "model", "system_prompt", "params", "created")},
        "messages": sorted(
            (key(m["id"]), json.dumps({k: v for k, v in m.items() if k not in drop}, sort_keys=True))
            for m in data["messages"]
        ),
        "current": key(data["current"]),
    }


def test_export_then_import_gives_the_same_tree_with_new_ids(alice, bob, tree):
    exported = client_for(alice).get(f"/api/conversations/{tree.pk}/export?format=json")
    assert exported.status_code == 200 and "attachment" in exported["Content-Disposition"]
    body = read(exported)
    assert len(json.loads(body)["conversations"][0]["messages"]) == 5  # every branch
    imported = client_for(bob).post("/api/import", body, content_type="application/json")
    assert imported.status_code == 201
    copy = Conversation.objects.get(pk=imported.json()["conversations"][0]["id"])
    assert copy.owner == bob and copy.pk != tree.pk
    assert not set(copy.messages.values_list("pk", flat=True)) & set(tree.messages.values_list("pk", flat=True))
    assert shape(copy) == shape(tree)
    assert [m.content for m in copy.path()] == ["Write about the sea", "Tides **roll**", "Shorter", "Tides."]
    # Usage is informational: kept on the message, exported again, but never a (billable) usage row.
    assert not Usage.objects.filter(user=bob).exists()
    assert copy.messages.get(content="Waves").imported_usage["completion_tokens"] == 4


def test_export_all_as_json_and_markdown(alice, bob, tree):
    Conversation.objects.create(owner=bob, title="Bob's secret")
    owner = client_for(alice)
    everything = json.loads(read(owner.get("/api/export?format=json")))
    assert everything["format"] == exports.FORMAT
    assert [c["title"] for c in everything["conversations"]] == ["Ocean poem"]
    md = read(owner.get("/api/export?format=md")).decode()
    assert md.startswith("# Ocean poem") and "Tides **roll**" in md and "Waves" not in md  # the branch shown
    assert "<details><summary>" not in md.split("Tides **roll**")[1]
    single = owner.get(f"/api/conversations/{tree.pk}/export?format=md")
    assert single["Content-Type"].startswith("text/markdown")
    assert 'filename="ocean-poem.md"' in single["Content-Disposition"]
    assert owner.get(f"/api/conversations/{tree.pk}/export?format=pdf").status_code == 400
    assert client_for(bob).get(f"/api/conversations/{tree.pk}/export?format=json").status_code == 404
    assert Client().get("/api/export").status_code == 401


def messages(*rows, **more) -> bytes:
    return json.dumps({"messages": list(rows), **more}).encode()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json at all", "not JSON"),
        (b"[1, 2]", "not an export"),
        (b'{"hello": 1}', "The file is not an export of this chat."),
        (json.dumps({"format": "other", "conversations": []}).encode(), "not an export"),
        (messages({"id": 1, "parent": 2, "role": "user", "content": "x"}), "not in the file"),
        (messages({"id": 1, "parent": 2, "role": "user"}, {"id": 2, "parent": 1, "role": "assistant"}), "loop"),
        (messages({"id": 1, "role": "system", "content": "x"}), "role must be"),
        (messages({"id": 1, "role": "user", "content": 5}), "Conversation 1, message 1: content must be text"),
        (messages({"id": 1, "role": "assistant", "thinking_ms": 2**40}), "thinking_ms must be a whole number"),
        (messages({"id": 1, "role": "user"}, {"id": 1, "role": "user"}), "id of its own"),
        (messages(params={"temperature": 9}), "temperature"),
        (messages({"id": 1, "role": "user"}, current=7), "`current`"),
        (messages({"id": 1, "role": "assistant", "usage": {"cost": "free"}}), "usage.cost"),
        # Taken as now, an unreadable date put the first question after its answers.
        (messages({"id": 1, "role": "user", "created": "not a date"}), "message 1: created is not a date"),
        (messages({"id": 1, "role": "user", "created": "2026-02-30T10:00:00Z"}), "created is not a date"),
        (messages({"id": 1, "role": "user", "created": 1e30}), "created is not a date"),
        (messages(updated="9999-99-99T99:99:99Z"), "Conversation 1: updated is not a date"),
    ],
)
def test_import_refuses_a_bad_file_with_a_clear_error(bob, body, says):
    response = client_for(bob).post("/api/import", body, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_import"
    assert says in response.json()["error"]["detail"], response.json()
    assert not Conversation.objects.filter(owner=bob).exists()  # nothing half-imported


def test_import_refuses_an_oversized_file(bob, tree, settings):
    settings.CHAT_IMPORT_MAX_BYTES = 1000
    body = json.dumps(exports.export_json([tree])).encode() + b" " * 1000
    response = client_for(bob).post("/api/import", body, content_type="application/json")
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"
    assert "larger than 0.001 MB" in response.json()["error"]["detail"]
    assert not Conversation.objects.filter(owner=bob).exists()


def test_a_deep_conversation_is_imported_in_a_few_queries(bob, django_assert_max_num_queries):
    chain = [{"id": n, "parent": n - 1 if n else None, "role": "user" if n % 2 == 0 else "assistant",
              "content": f"message {n}", "created": "2026-02-28T10:00:00Z"} for n in range(400)]  # fmt: skip
    chain[-1]["status"] = "streaming"  # exported while it streamed: here it is over
    with django_assert_max_num_queries(20):
        (copy,) = imports.import_now(bob, messages(*chain, current=399, title="Long"))
    path = copy.path()
    assert [m.content for m in path] == [f"message {n}" for n in range(400)]
    assert path[-1].status == "interrupted" and copy.title == "Long"


def test_exporting_everything_reads_a_few_queries_however_many_conversations(
    alice, tree, django_assert_max_num_queries
):
    for n in range(30):
        c = Conversation.objects.create(owner=alice, title=f"Chat {n}")
        ask = Message.objects.create(conversation=c, role="user", content=f"question {n}")
        c.current = Message.objects.create(conversation=c, parent=ask, role="assistant", content=f"answer {n}")
        c.save()
    # Each of the two: conversations, messages, their usage rows (one per stream), attachments; not one a conversation.
    with django_assert_max_num_queries(8):
        everything = exports.export_json(Conversation.objects.owned_by(alice).order_by("created"))
        md = exports.markdown_all(Conversation.objects.owned_by(alice).order_by("created"))
    assert len(everything["conversations"]) == 31 and "answer 29" in md
    assert everything["conversations"][0]["messages"][2]["usage"]["completion_tokens"] == 9


def test_the_settings_page_says_the_import_limit_and_links_the_exports(bob, settings):
    settings.CHAT_IMPORT_MAX_BYTES = 1_500_000
    page = client_for(bob).get("/settings/").content.decode()
    assert 'data-max-bytes="1500000"' in page and "at most 1.5 MB" in page
    assert 'href="/api/export?format=json"' in page and 'href="/api/export?format=md"' in page


def test_a_long_conversation_is_read_a_page_at_a_time(bob, settings):
    settings.CHAT_PAGE_MESSAGES = 50
    chain = [{"id": n, "parent": n - 1 if n else None, "role": "user" if n % 2 == 0 else "assistant",
              "content": f"message {n}"} for n in range(120)]  # fmt: skip
    (copy,) = imports.import_now(bob, messages(*chain, current=119))
    client = client_for(bob)
    last = client.get(f"/api/conversations/{copy.pk}").json()
    assert [m["content"] for m in last["messages"]] == [f"message {n}" for n in range(70, 120)] and last["earlier"]
    before = client.get(f"/api/conversations/{copy.pk}?before={last['messages'][0]['id']}").json()
    assert [m["content"] for m in before["messages"]] == [f"message {n}" for n in range(20, 70)] and before["earlier"]
    first = client.get(f"/api/conversations/{copy.pk}?before={before['messages'][0]['id']}").json()
    assert [m["content"] for m in first["messages"]] == [f"message {n}" for n in range(20)] and not first["earlier"]
    assert client.get(f"/api/conversations/{copy.pk}?before=x²").status_code == 400


def test_exports_are_written_a_page_at_a_time_and_say_what_the_whole_did(alice, tree, settings):
    settings.CHAT_PAGE_MESSAGES = 7
    chain = [{"id": n, "parent": n - 1 if n else None, "role": "user" if n % 2 == 0 else "assistant",
              "content": f"message {n}\n" if n % 3 else f"message {n}"} for n in range(40)]  # fmt: skip
    imports.import_now(alice, messages(*chain, current=39, title="Long", system_prompt="Terse"))
    everything = Conversation.objects.owned_by(alice).order_by("created", "pk")
    owner = client_for(alice)
    response = owner.get("/api/export?format=json")
    pieces = async_to_sync(_collect)(response)
    assert len(pieces) > 40 // 7  # not one piece: a page of messages at a time
    streamed, whole = json.loads(b"".join(pieces)), exports.export_json(everything)
    assert {**streamed, "exported": None} == {**whole, "exported": None}
    assert read(owner.get("/api/export?format=md")).decode() == exports.markdown_all(everything)
    long = everything.get(title="Long")
    assert read(owner.get(f"/api/conversations/{long.pk}/export?format=md")).decode() == exports.markdown(long)


async def _collect(response) -> list[bytes]:
    return [chunk async for chunk in response.streaming_content]
