"""Attachments on the chat page in a real Chromium, against the real server and the fake upstream.

Files are attached the three ways a person does: the button's file chooser, a drop (a real
DataTransfer carrying File objects, dispatched on the page), and a paste (a ClipboardEvent
whose clipboardData carries the image). What reached the upstream is checked at the fake.
"""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image
from playwright.sync_api import expect

from chat.models import Attachment, Conversation, Message
from tests import files
from tests.page_helpers import API14_MINI, CLAUDE, choose_model, open_chat, screenshot, wait_done
from tests.views.test_attachments import limited  # noqa: F401  (the server with small limits, a fixture)

expect.set_options(timeout=15_000)
NOTES = b"# Launch checklist\n\n- book the room\n- send the invitations\n"
REPORT = files.pdf("Revenue in October was 42 million euros.")


@pytest.fixture
def chat(new_page, alice, providers):
    """Alice, signed in, on an empty chat page."""
    page = new_page(alice)
    open_chat(page)
    return page


def drop(page, name: str, data: bytes, mime: str) -> None:
    """Drop a file on the chat, as a drag from the desktop does."""
    transfer = page.evaluate_handle(
        """([name, b64, mime]) => {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], name, { type: mime }));
            return transfer;
        }""",
        [name, base64.b64encode(data).decode(), mime],
    )
    page.dispatch_event("main.main", "dragover", {"dataTransfer": transfer})
    page.dispatch_event("main.main", "drop", {"dataTransfer": transfer})


def paste(page, name: str, data: bytes, mime: str) -> None:
    """Paste a file into the message box, as Ctrl+V of a screenshot does."""
    page.get_by_label("Message").evaluate(
        """(box, [name, b64, mime]) => {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const clipboardData = new DataTransfer();
            clipboardData.items.add(new File([bytes], name, { type: mime }));
            box.dispatchEvent(new ClipboardEvent("paste", { clipboardData, bubbles: true, cancelable: true }));
        }""",
        [name, base64.b64encode(data).decode(), mime],
    )


def choose_files(page, *chosen: tuple[str, bytes, str]) -> None:
    """Click the attach button and pick files in the chooser it opens."""
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach files").click()
    chooser.value.set_files([{"name": n, "mimeType": m, "buffer": d} for n, d, m in chosen])


def chips(page):
    return page.get_by_test_id("attachment-chips").locator("li.chip")


def ready(page, count: int) -> None:
    expect(chips(page)).to_have_count(count)
    expect(page.get_by_test_id("attachment-chips").locator("li.chip[data-state=ready]")).to_have_count(count)


def test_attach_by_button_drop_and_paste_send_and_see_them_at_the_upstream(chat, providers, fake, alice):
    page = chat
    providers["api14"].image_models = "openai/gpt-5-mini"
    providers["api14"].save()
    page.reload()
    open_chat(page)
    choose_model(page, API14_MINI)
    photo = files.image(3000, 1500, "JPEG", exif=True)
    choose_files(page, ("notes.md", NOTES, "text/markdown"))
    drop(page, "report.pdf", REPORT, "application/pdf")
    paste(page, "image.png", files.image(300, 200, "PNG"), "image/png")
    choose_files(page, ("photo.jpg", photo, "image/jpeg"))
    ready(page, 4)
    notes, report, pasted, camera = (chips(page).nth(i) for i in range(4))
    expect(notes).to_contain_text("notes.md")
    expect(notes).to_contain_text(f"{len(NOTES)} bytes · ≈15 tokens")
    expect(report).to_contain_text("report.pdf")
    expect(report).to_contain_text("≈10 tokens")
    expect(camera).to_contain_text("photo.jpg")
    for image in (pasted, camera):  # thumbnails, loaded from the server's re-encoded copy
        thumb = image.locator("img")
        expect(thumb).to_be_visible()
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=thumb.element_handle())
    assert camera.locator("img").evaluate("img => [img.naturalWidth, img.naturalHeight]") == [1024, 2048]
    # Removing one before sending: its chip goes, and so does the upload.
    page.get_by_role("button", name="Remove image.png").click()
    expect(chips(page)).to_have_count(3)
    box = page.get_by_label("Message")
    screenshot(page, "attachments-composer")
    box.fill("Summarise these, please.")
    box.press("Enter")
    reply = page.locator("article.message.assistant").last
    wait_done(reply)
    expect(chips(page)).to_have_count(0)
    # At the fake upstream: the documents as delimited text before the words, the photo as a data URL part.
    content = fake.app.last().body["messages"][-1]["content"]
    assert content[0] == {
        "type": "text",
        "text": '<attachment name="notes.md">\n' + NOTES.decode() + "\n</attachment>\n\n"
        '<attachment name="report.pdf">\nRevenue in October was 42 million euros.\n</attachment>\n\n'
        "Summarise these, please.",
    }
    assert content[1]["type"] == "image_url" and len(content) == 2
    url = content[1]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    sent = base64.b64decode(url.split(",", 1)[1])
    assert b"Secret Camera 9000" not in sent and b"Secret Camera 9000" in photo  # EXIF stripped
    with Image.open(io.BytesIO(sent)) as image:
        assert image.size == (1024, 2048)  # turned upright and fitted in 2048 px
    # Stored with the message; the removed upload is gone.
    user_message = Message.objects.get(role="user")
    assert [a.name for a in user_message.attachments.all()] == ["notes.md", "report.pdf", "photo.jpg"]
    assert not Attachment.objects.filter(message__isnull=True).exists()
    # The sent message shows them; a reload shows them from the server; the thumbnail opens full size.
    sent_chips = page.locator("article.message.user .message-attachments li.chip")
    expect(sent_chips).to_have_count(3)
    open_chat(page, re.sub(r"^https?://[^/]+", "", page.url))  # loaded again, from the server
    expect(sent_chips).to_have_count(3)
    expect(sent_chips.nth(1)).to_contain_text("≈10 tokens")
    expect(page.get_by_role("link", name="report.pdf")).to_have_attribute("href", re.compile(r"^/api/attachments/\d+$"))
    screenshot(page, "attachments")
    page.get_by_role("button", name="Open photo.jpg full size").click()
    dialog = page.locator("#image-dialog")
    expect(dialog).to_be_visible()
    page.wait_for_function("() => document.getElementById('image-full').naturalWidth === 1024")
    screenshot(page, "attachment-image")
    page.get_by_role("button", name="Close image").click()
    expect(dialog).to_be_hidden()
    # A regenerated answer is asked with the same attachments.
    fake.app.reset()
    answer = page.locator("article.message.assistant").last
    first = answer.get_attribute("data-message-id")
    answer.get_by_role("button", name="Regenerate").click()
    expect(page.locator(f'article.message.assistant[data-message-id="{first}"]')).to_have_count(0)
    wait_done(page.locator("article.message.assistant").last)
    assert fake.app.last().body["messages"][-1]["content"] == content


def test_more_files_than_the_server_uploads_at_once_all_go_in_turn(chat, providers, fake):
    """The server takes a person's uploads a few at a time (ATTACHMENT_MAX_UPLOADS_IN_FLIGHT, 4): eight files
    chosen together are uploaded four at a time, not four kept and four refused."""
    page = chat
    chosen = [(f"note-{n}.txt", f"Note number {n}.\n".encode(), "text/plain") for n in range(8)]
    choose_files(page, *chosen)
    ready(page, 8)
    expect(page.get_by_role("alert")).to_have_count(0)
    box = page.get_by_label("Message")
    box.fill("Read all eight.")
    box.press("Enter")
    wait_done(page.locator("article.message.assistant").last)
    sent = fake.app.last().body["messages"][-1]["content"]
    assert all(f"Note number {n}." in sent for n in range(8)), sent


def test_a_model_that_takes_no_images_refuses_the_image_before_sending(chat, providers, fake):
    page = chat
    choose_model(page, CLAUDE)
    paste(page, "screenshot.png", files.image(50, 50), "image/png")
    ready(page, 1)
    box = page.get_by_label("Message")
    box.fill("What is this?")
    box.press("Enter")
    expect(page.locator("#notice")).to_contain_text(
        "claude-sonnet-5 does not accept images: remove the image, or pick a model that accepts them."
    )
    expect(box).to_have_value("What is this?")  # nothing sent, nothing lost
    expect(chips(page)).to_have_count(1)
    assert not fake.app.streams and not Conversation.objects.exists()
    # Documents are fine for it.
    page.get_by_role("button", name="Remove screenshot.png").click()
    choose_files(page, ("notes.md", NOTES, "text/markdown"))
    ready(page, 1)
    box.press("Enter")
    wait_done(page.locator("article.message.assistant").last)
    assert '<attachment name="notes.md">' in fake.app.last().body["messages"][-1]["content"]


def test_a_crafted_or_truncated_pdf_and_a_broken_image_are_clear_errors(chat, providers, fake):
    page = chat
    choose_files(page, ("report.pdf", REPORT[: len(REPORT) // 3], "application/pdf"))
    expect(page.locator("#notice")).to_contain_text("report.pdf: The PDF could not be read")
    expect(chips(page)).to_have_count(0)
    crafted = re.sub(rb"<< /Length (\d+) >>", rb"<< /Length \1 /Filter /FlateDecode >>", REPORT)
    drop(page, "crafted.pdf", crafted, "application/pdf")
    expect(page.locator("#notice")).to_contain_text("crafted.pdf: The PDF")
    paste(page, "cut.png", files.image(200, 200)[:300], "image/png")
    expect(page.locator("#notice")).to_contain_text("cut.png: The image could not be read")
    expect(chips(page)).to_have_count(0)
    # Nothing else broke: the page still sends and streams.
    box = page.get_by_label("Message")
    box.fill("still here")
    box.press("Enter")
    wait_done(page.locator("article.message.assistant").last)
    assert not Attachment.objects.exists()


def test_limits_per_file_per_message_and_tokens(new_page, limited, alice, providers, fake):  # noqa: F811
    """On a server with 50 kB a file, 80 kB a message and 2,000 tokens."""
    providers["api14"].image_models = "*"
    providers["api14"].save()
    page = new_page(alice, url=limited.url)
    open_chat(page)
    choose_model(page, API14_MINI)
    # Over the file limit: refused in the page, never uploaded.
    choose_files(page, ("big.csv", b"a,b\n" * 13_000, "text/csv"))
    expect(page.locator("#notice")).to_contain_text("big.csv is 52 KB, over the limit of 50 KB per file.")
    expect(chips(page)).to_have_count(0)
    # Over the token limit by itself: refused by the server when uploaded.
    choose_files(page, ("long.txt", b"word " * 2_000, "text/plain"))
    expect(page.locator("#notice")).to_contain_text("long.txt comes to about 2,500 tokens, over the limit of 2,000")
    # Two files that fit alone, but not together.
    choose_files(page, ("one.png", files.noise(120, 120), "image/png"), ("two.png", files.noise(120, 120), "image/png"))
    ready(page, 2)
    page.get_by_label("Message").fill("compare")
    page.get_by_label("Message").press("Enter")
    expect(page.locator("#notice")).to_contain_text("over the limit of 80 KB per message")
    assert not fake.app.streams
    page.get_by_role("button", name="Remove two.png").click()
    page.get_by_label("Message").press("Enter")
    wait_done(page.locator("article.message.assistant").last)
    assert fake.app.last().body["messages"][-1]["content"][1]["type"] == "image_url"
