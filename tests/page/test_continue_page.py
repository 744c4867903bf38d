"""A shared link in a real Chromium is no dead end (chat/actions/continuations.py): a signed-in reader copies it
into their own chats with "Continue in my chats" (attachments included, within their quota) and goes on
there; an anonymous reader of a public link is sent to sign in first; code blocks have their copy button.
"""

from __future__ import annotations

import re
import uuid

from django.conf import settings as django_settings
from django.core.files.base import ContentFile
from django.db import connection
from playwright.sync_api import expect

from chat.actions.shares import create_share
from chat.models import Attachment, Conversation, Message
from chat.models.attachments import attachment_storage
from tests.live import LiveServer, database_url
from tests.page_helpers import CLAUDE, I14, open_chat, screenshot, send, wait_done

expect.set_options(timeout=15_000)

CODE = "print('hello from the shared page')"
ANSWER = f"Run this:\n\n```python\n{CODE}\n```\n\nThen tell me what it printed."
NOTES = b"Packing list: tent, stove, maps.\n"


def stored_attachment(owner, message, name: str, data: bytes) -> Attachment:
    """A document attached to `message`, stored where the server keeps attachments."""
    text = data.decode()
    attachment = Attachment(
        owner=owner, message=message, name=name, kind=Attachment.Kind.DOCUMENT, content_type="text/plain",
        size=len(data), stored_bytes=len(data) + len(text.encode()), text=text, tokens=12,
    )  # fmt: skip
    if django_settings.ATTACHMENT_STORAGE == "database":
        attachment.data = data
    else:
        attachment.path = attachment_storage().save(f"{owner.pk}/{uuid.uuid4().hex}", ContentFile(data))
    attachment.save()
    return attachment


def shared_trip(alice, public: bool = False):
    conversation = Conversation.objects.create(owner=alice, title="Camping trip", model=I14)
    ask = Message.objects.create(conversation=conversation, role="user", content="What should I run?")
    stored_attachment(alice, ask, "notes.txt", NOTES)
    reply = Message.objects.create(
        conversation=conversation, parent=ask, role="assistant", content=ANSWER, model=I14.split("/", 1)[1]
    )
    Conversation.objects.filter(pk=conversation.pk).update(current=reply)
    conversation.refresh_from_db()
    return create_share(conversation, live=False, public=public, show_usage=False)


def test_a_reader_continues_a_shared_conversation_in_their_own_chats(new_page, alice, bob, providers):
    share = shared_trip(alice)
    page = new_page(bob, viewport={"width": 1440, "height": 900})
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(f"/s/{share.token}/")
    # The code block's own copy button, in the shared view too.
    block = page.locator("article.message.assistant .code-block")
    copy = block.get_by_role("button", name=re.compile("^Copy"))
    expect(copy).to_be_visible()
    copy.click()
    expect(block.locator(".copy-code")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()").strip() == CODE
    screenshot(page, "shared-continue")

    page.get_by_role("button", name="Continue in my chats").click()
    expect(page).to_have_url(re.compile(r"/c/\d+/$"))
    copy_id = int(re.search(r"/c/(\d+)/$", page.url).group(1))
    open_chat(page, f"/c/{copy_id}/")
    expect(page.locator("#chat-title")).to_have_text("Camping trip")
    expect(page.locator("article.message.user .user-text")).to_have_text("What should I run?")
    expect(page.locator("article.message.user").get_by_text("notes.txt")).to_be_visible()
    expect(page.locator("article.message.assistant .code-block code")).to_have_text(CODE)
    expect(page.locator("#conversation-list li .conversation-title")).to_have_text(["Camping trip"])
    # Bob's own now: his copy of the attachment, and he goes on where it ended.
    mine = Conversation.objects.get(pk=copy_id)
    assert mine.owner_id == bob.pk
    (attachment,) = Attachment.objects.filter(message__conversation=mine)
    assert attachment.owner_id == bob.pk and attachment.read() == NOTES
    assert Attachment.objects.filter(owner=alice).count() == 1  # alice's stays hers
    page.get_by_label("Model").select_option(CLAUDE)
    reply = send(page, "[[echo]] It printed hello")
    wait_done(reply)
    expect(reply.locator(".answer")).to_have_text("It printed hello")
    mine.refresh_from_db()
    assert [m.content for m in mine.path()][-1] == "It printed hello"
    share.conversation.refresh_from_db()
    assert share.conversation.messages.count() == 2  # the shared one is untouched


def test_continuing_over_the_readers_quota_copies_nothing_and_says_why(new_page, alice, bob, providers):
    share = shared_trip(alice)
    stored_attachment(bob, None, "big.txt", b"x" * 900)  # his own files: 1,800 bytes counted
    env = {"DATABASE_URL": database_url(connection.settings_dict), "ATTACHMENT_QUOTA_BYTES": "1850",
           "DJANGO_ALLOW_ASYNC_UNSAFE": ""}  # fmt: skip
    with LiveServer(env) as live:
        page = new_page(bob, url=live.url)
        page.goto(f"/s/{share.token}/")
        page.get_by_role("button", name="Continue in my chats").click()
        expect(page.get_by_role("alert")).to_contain_text("over your quota")
        assert not Conversation.objects.filter(owner=bob).exists()


def test_an_anonymous_reader_of_a_public_link_signs_in_first(new_page, alice, bob, providers, settings):
    settings.CHAT_PUBLIC_SHARES = True
    share = shared_trip(alice, public=True)
    env = {"DATABASE_URL": database_url(connection.settings_dict), "CHAT_PUBLIC_SHARES": "1",
           "DJANGO_ALLOW_ASYNC_UNSAFE": ""}  # fmt: skip
    with LiveServer(env) as live:
        page = new_page(url=live.url)
        page.goto(f"/s/{share.token}/")
        expect(page.locator("article.message.assistant .code-block .copy-code")).to_be_visible()
        page.get_by_role("link", name="Sign in to continue in your chats").click()
        expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/s/"))
        page.get_by_label("Username").fill("bob")
        page.get_by_label("Password").fill("bob-secret-pw")
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(re.compile(rf"/s/{share.token}/$"))  # back on the link, signed in
        page.get_by_role("button", name="Continue in my chats").click()
        expect(page).to_have_url(re.compile(r"/c/\d+/$"))
        assert Conversation.objects.get(owner=bob).title == "Camping trip"
