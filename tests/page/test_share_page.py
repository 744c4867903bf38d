"""Share links in a real Chromium: the dialog on the chat page, the shared page (payloads stay inert,
markdown drawn by the chat's renderer), revoking, and the admin's review drawn the same way.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from chat.actions import exports
from chat.actions.shares import create_share
from chat.models import Conversation, Message, Share, Usage
from tests.page.test_a11y import violations
from tests.page_helpers import I14, open_chat, screenshot

expect.set_options(timeout=15_000)

# Each payload would set window.__xss (or run a script) if the page interpreted it as HTML or a URL.
PAYLOADS = [
    "<script>window.__xss = 'script'</script>",
    "<img src=x onerror=\"window.__xss = 'img'\">",
    "[click me](javascript:window.__xss='link')",
    "<svg onload=\"window.__xss = 'svg'\"></svg>",
    "<iframe srcdoc=\"<script>parent.__xss='iframe'</script>\"></iframe>",
    "![x](x\" onerror=\"window.__xss='md-img')",
]
TIDES = """Tides come from the **Moon**'s pull, helped by the Sun's:

1. The side of the Earth facing the Moon is pulled a little more: a bulge of water.
2. The far side is pulled a little less: a second bulge.
3. The Earth turns under both, so most coasts get **two high tides a day**.

| | Spring tides | Neap tides |
|---|---|---|
| Sun and Moon | in line | at right angles |
| Range | largest | smallest |

```python
hours_between_high_tides = 24.84 / 2  # a lunar day, two bulges
```
"""
TITLE = "<img src=x onerror=\"window.__xss = 'title'\"> Poems"


@pytest.fixture
def shared(alice):
    """Alice's conversation with a branch not shown, payloads in the title and every message, and its snapshot link."""
    conversation = Conversation.objects.create(owner=alice, title=TITLE, model="i14/m")
    ask = Message.objects.create(
        conversation=conversation, role="user", content="Write **about** the sea\n" + PAYLOADS[0]
    )
    Message.objects.create(
        conversation=conversation, parent=ask, role="assistant", content="An older answer, not shown"
    )
    answer = "## Waves\n\nThey **roll** in:\n\n```python\nprint('tide')\n```\n\n" + "\n\n".join(PAYLOADS)
    reply = Message.objects.create(
        conversation=conversation, parent=ask, role="assistant", content=answer, reasoning=PAYLOADS[1], model="m"
    )
    Usage.objects.create(
        user=alice, message=reply, model="m", status="complete", prompt_tokens=11, completion_tokens=42
    )
    conversation.current = reply
    conversation.save()
    return create_share(conversation, live=False, public=False, show_usage=False)


def assert_inert(page):
    assert page.evaluate("window.__xss") is None
    thread = page.locator("#thread")
    assert thread.locator("script, iframe, svg[onload], [onerror], [onload]").count() == 0
    assert thread.locator('a[href^="javascript:"]').count() == 0


def test_a_shared_page_shows_the_branch_drawn_by_the_chat_and_payloads_stay_inert(new_page, bob, shared):
    page = new_page(bob)
    page.goto(f"/s/{shared.token}/")
    answer = page.locator("article.message.assistant .answer")
    expect(answer.locator("h2")).to_have_text("Waves")  # markdown, by the chat's renderer
    expect(answer.locator("strong")).to_have_text("roll")
    expect(answer.locator(".code-block[data-lang=python]")).to_be_visible()
    assert_inert(page)
    assert violations(page) == []
    expect(page.locator("#shared-title")).to_have_text(TITLE)  # the title as text
    expect(page).to_have_title(re.compile("Poems"))
    expect(answer).to_contain_text("<script>window.__xss = 'script'</script>")  # shown, not run
    expect(page.locator("article.message.user .user-text")).to_contain_text("<script>")
    assert "An older answer" not in page.locator("#thread").inner_text()  # the branch shown only
    expect(page.locator("article.message .usage")).to_be_hidden()  # no usage unless the owner chose it
    expect(page.locator("article.message .message-actions")).to_have_count(0)  # read only
    page.locator("article.message.assistant .thinking summary").click()  # reasoning folded, as text
    expect(page.locator("article.message.assistant .thinking-body")).to_contain_text("onerror")
    assert_inert(page)

    anonymous = new_page()
    anonymous.goto(f"/s/{shared.token}/")
    expect(anonymous).to_have_url(re.compile(r"/accounts/login/\?next="))


def test_the_owner_shares_from_the_chat_page_and_revokes(new_page, alice, bob, providers):
    conversation = Conversation.objects.create(owner=alice, title="What makes tides", model=I14)
    ask = Message.objects.create(conversation=conversation, role="user", content="What makes tides, in short?")
    model = I14.split("/", 1)[1]
    thought = "The moon and the sun; keep it short."
    reply = Message.objects.create(
        conversation=conversation, parent=ask, role="assistant", model=model, content=TIDES, reasoning=thought,
        thinking_ms=2400,
    )  # fmt: skip
    Usage.objects.create(
        user=alice, message=reply, model=model, status="complete", prompt_tokens=18, completion_tokens=96,
        total_tokens=114, cost=Decimal("0.00042"), ttft_ms=310,
    )  # fmt: skip
    Conversation.objects.filter(pk=conversation.pk).update(current=reply)
    page = new_page(alice)
    open_chat(page, f"/c/{conversation.pk}/")
    page.get_by_role("button", name="Share or export").click()
    dialog = page.locator("#share-dialog")
    expect(dialog.get_by_role("link", name="Export JSON")).to_have_attribute(
        "href", f"/api/conversations/{conversation.pk}/export?format=json"
    )
    expect(dialog.get_by_text("Links open for signed-in members of the team only.")).to_be_visible()
    assert violations(page) == []
    dialog.get_by_label("Show tokens and cost").check()
    dialog.get_by_role("button", name="Create link").click()
    link = dialog.locator(".share-url").first
    expect(link).to_have_value(re.compile(r"/s/[\w-]{32}/$"))
    expect(dialog.locator(".share-kind").first).to_have_text("snapshot · with usage")
    url = link.input_value()
    screenshot(page, "share-dialog")

    reader = new_page(bob, viewport={"width": 1000, "height": 760})
    reader.goto(url)
    expect(reader.locator("article.message.assistant .answer strong").first).to_have_text("Moon")
    expect(reader.locator("article.message.assistant .usage")).to_contain_text("18 in")  # the owner chose usage
    screenshot(reader, "shared")

    dialog.get_by_role("button", name="Revoke").click()
    expect(dialog.locator(".share-row")).to_have_count(0)
    assert reader.goto(url).status == 404


def test_the_admin_review_draws_answers_with_the_chats_renderer(new_page, django_user_model, shared):
    staff = django_user_model.objects.create_superuser("stella", password="stella-secret-pw")
    page = new_page(staff)
    page.goto(f"/admin/chat/conversation/{shared.conversation_id}/change/")
    review = page.locator("#review")
    expect(review.locator(".review-branch")).to_have_text(["Branch 1 of 2", "Branch 2 of 2 · the branch shown"])
    expect(review.locator(".review-answer h2")).to_have_text("Waves")
    expect(review.locator(".review-answer strong")).to_have_text("roll")
    expect(review.locator(".review-reasoning")).not_to_have_attribute("open", "")
    review.scroll_into_view_if_needed()
    screenshot(page, "admin-review")
    assert page.evaluate("window.__xss") is None
    assert review.locator("script, iframe, [onerror], [onload], a[href^='javascript:']").count() == 0


def test_the_settings_page_brings_back_an_export_refuses_a_bad_file_and_lists_links(new_page, alice, bob, shared):
    exported = json.dumps(exports.export_json([shared.conversation])).encode()
    page = new_page(bob)
    page.goto("/settings/")
    data = page.get_by_test_id("settings-data")
    expect(data.get_by_role("link", name="Export all as JSON")).to_have_attribute("href", "/api/export?format=json")
    expect(data.get_by_text("You have not shared any conversation.")).to_be_visible()
    assert violations(page) == []
    data.locator("#import-file").set_input_files({"name": "notes.json", "mimeType": "application/json", "buffer": b"{"})
    data.get_by_role("button", name="Import").click()
    expect(data.locator("#import-status")).to_have_text(re.compile(r"^Not imported: The file is not JSON"))
    expect(data.locator("#import-status")).to_have_class(re.compile(r"\bform-error\b"))  # shown as an error
    data.locator("#import-file").set_input_files({"name": "c.json", "mimeType": "application/json", "buffer": exported})
    data.get_by_role("button", name="Import").click()
    expect(data.locator("#import-status")).to_contain_text("Imported “")
    expect(data.locator("#import-status")).not_to_have_class(re.compile(r"\bform-error\b"))
    copy = Conversation.objects.get(owner=bob)
    expect(data.get_by_role("link", name="Open it")).to_have_attribute("href", f"/c/{copy.pk}/")
    assert [m.content for m in copy.path()] == [m.content for m in shared.conversation.path()]
    several = json.dumps(exports.export_json([shared.conversation, copy])).encode()
    two = {"name": "two.json", "mimeType": "application/json", "buffer": several}
    data.locator("#import-file").set_input_files(two)
    data.get_by_role("button", name="Import").click()
    expect(data.locator("#import-status")).to_contain_text("Imported 2 conversations.")
    first = Conversation.objects.filter(owner=bob).order_by("pk")[1]  # the first of the file, imported
    link = data.get_by_role("link", name=f"Open “{first.title}”")  # which one it opens, not "Open it"
    expect(link).to_have_attribute("href", f"/c/{first.pk}/")

    Share.objects.filter(pk=shared.pk).update(show_name=True, show_usage=True)
    owner = new_page(alice)
    owner.goto("/settings/")
    links = owner.locator("#share-list .share-row")
    expect(links).to_have_count(1)
    # What the link shows, as the share dialog says it
    expect(links.locator(".share-kind")).to_have_text(re.compile(r"^snapshot · with usage · with your name · \d"))
    owner.get_by_test_id("settings-data").scroll_into_view_if_needed()
    screenshot(owner, "settings-data")
    expect(links.get_by_role("link")).to_have_attribute("href", f"/s/{shared.token}/")
    links.get_by_role("button", name=re.compile("^Revoke")).click()
    expect(links).to_have_count(0)
    expect(owner.get_by_text("You have not shared any conversation.")).to_be_visible()
    assert not Share.objects.exists()
