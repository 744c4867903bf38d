"""Attachments without a browser: reading files (chat/lib/attachment_content.py), the limits, storage and deletion, the
upload and download over HTTP against the real server, the websocket `send` with attachments, and /v1 image parts
through the OpenAI SDK. The page itself is tests/page/test_attachments_page.py."""

from __future__ import annotations

import base64
import io
import multiprocessing
import re
import zipfile
from contextlib import closing

import httpx
import openai
import pytest
from django.conf import settings
from django.test import override_settings
from PIL import Image

from chat.actions.attachments import store_upload
from chat.lib import attachment_content
from chat.lib.token_estimate import estimate_tokens
from chat.models import ApiToken, Attachment, Conversation, Message
from chat.streaming.history import upstream_content
from tests import files
from tests.conftest import MODELS, session_cookie
from tests.live import LiveServer, database_url

pytestmark = pytest.mark.django_db(transaction=True)
CLAUDE = MODELS["infyrence"]
GPT = MODELS["api14"]


# --- reading files: the type from the bytes, the text, the image re-encoded ---------------------


@pytest.mark.parametrize(
    ("data", "kind", "text"),
    [
        (b"# Notes\n\n- one\n- two\n", "text", "# Notes\n\n- one\n- two"),
        (b"name,amount\r\nalice,3\r\n", "text", "name,amount\nalice,3"),
        (b'{"answer": 42}', "text", '{"answer": 42}'),
        ("déjà vu, 日本語".encode(), "text", "déjà vu, 日本語"),
        ("utf-16 text".encode("utf-16"), "text", "utf-16 text"),
        (files.pdf("Quarterly revenue was 42 million", "Second page"), "pdf", "Quarterly revenue was 42 million"),
        (files.docx("A Word paragraph", "Another one"), "docx", "A Word paragraph\nAnother one"),
    ],
)
def test_documents_are_read_by_their_content(data, kind, text):
    read = attachment_content.inspect(data)
    assert read.kind == "document" and read.type == kind
    assert read.text.startswith(text)
    assert read.tokens == estimate_tokens(len(read.text)) > 0


def test_the_name_does_not_decide_the_type():
    # The upload's name never reaches inspect(): a PDF is a PDF whatever it is called, and so on.
    assert attachment_content.sniff(files.pdf("x")) == "pdf"
    assert attachment_content.sniff(files.image(format="PNG")) == "PNG"
    assert attachment_content.sniff(files.image(format="JPEG")) == "JPEG"
    assert attachment_content.sniff(files.image(format="WEBP")) == "WEBP"
    assert attachment_content.sniff(files.gif()) == "GIF"
    for unsupported in (b"\x00\x01\x02binary\xff\xfe", b"MZ\x90\x00" + bytes(100), b"text\x07bell"):
        with pytest.raises(attachment_content.Unreadable, match="not supported"):
            attachment_content.inspect(unsupported)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(attachment_content.Unreadable, match=r"not a Word \.docx"):
        attachment_content.inspect(archive.getvalue())


def test_a_word_documents_tables_are_read_too():
    import docx as python_docx

    document = python_docx.Document()
    document.add_paragraph("Prices")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "item", "price"
    table.cell(1, 0).text, table.cell(1, 1).text = "tea", "3"
    buffer = io.BytesIO()
    document.save(buffer)
    assert attachment_content.inspect(buffer.getvalue()).text == "Prices\nitem | price\ntea | 3"


def test_images_are_oriented_stripped_of_exif_fitted_in_2048_px_and_encoded_again():
    original = files.image(4000, 1000, "JPEG", exif=True)
    assert b"Secret Camera 9000" in original
    read = attachment_content.inspect(original)
    assert read.kind == "image" and read.content_type == "image/jpeg"
    # Orientation 6 applied (it stands upright now), then scaled to 2048 on the long side.
    assert (read.width, read.height) == (512, 2048)
    assert b"Secret Camera 9000" not in read.data and b"Exif" not in read.data
    with Image.open(io.BytesIO(read.data)) as image:
        assert image.size == (512, 2048) and not image.getexif()
        assert image.getpixel((500, 10))[2] > 150  # the blue corner, rotated from top-left to top-right
    small = attachment_content.inspect(files.image(64, 48, "PNG"))
    assert (small.width, small.height, small.content_type) == (64, 48, "image/png")  # never enlarged
    webp = attachment_content.inspect(files.image(3000, 3000, "WEBP"))
    assert (webp.width, webp.height, webp.content_type) == (2048, 2048, "image/webp")


def test_a_gif_becomes_its_first_frame_as_png():
    read = attachment_content.inspect(files.gif(frames=3))
    assert read.content_type == "image/png" and read.type == "GIF"
    with Image.open(io.BytesIO(read.data)) as image:
        assert image.format == "PNG" and getattr(image, "n_frames", 1) == 1
        assert image.convert("RGB").getpixel((5, 5)) == (0, 100, 200)  # frame 0's colour


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (files.pdf("a report")[:150], "PDF could not be read"),
        (b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 1 0 R >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF", "PDF"),
        (re.sub(rb"<< /Length (\d+) >>", rb"<< /Length \1 /Filter /FlateDecode >>", files.pdf("x")), "PDF"),
        (files.image(300, 300, "PNG")[:400], "image could not be read"),
        (files.image(300, 300, "JPEG")[:300], "image could not be read"),
        (files.docx("x")[:500], "Word document is damaged"),
    ],
    ids=["truncated-pdf", "pages-loop-pdf", "bad-flate-pdf", "truncated-png", "truncated-jpeg", "truncated-docx"],
)
def test_truncated_and_crafted_files_are_a_clear_error(data, message):
    with pytest.raises(attachment_content.Unreadable, match=message):
        attachment_content.inspect_limited(data, timeout=20)


def test_an_image_that_only_starts_like_one_says_so_without_python_internals():
    with pytest.raises(attachment_content.Unreadable) as refused:
        attachment_content.inspect_limited(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, timeout=20)
    assert str(refused.value) == "The image could not be read: it is not a PNG image."  # not "<_io.BytesIO … 0x…>"


def test_an_image_that_would_decode_to_gigabytes_is_refused_without_decoding():
    bomb = io.BytesIO()
    Image.new("1", (30_000, 30_000)).save(bomb, format="PNG")  # ~100 kB of PNG, 900 megapixels decoded
    with pytest.raises(attachment_content.Unreadable, match="too large"):
        attachment_content.inspect_limited(bomb.getvalue(), timeout=20)


def test_reading_is_given_up_at_the_time_limit_and_the_child_is_killed():
    big = files.image(6000, 6000, "PNG")
    with pytest.raises(attachment_content.Unreadable, match="took longer than"):
        attachment_content.inspect_limited(big, timeout=0.01)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("ForkServerProcess")]
    assert attachment_content.inspect_limited(files.pdf("still fine"), timeout=20).text == "still fine"


def test_a_pdf_with_no_text_and_a_protected_one_say_why():
    from pypdf import PdfWriter

    blank = io.BytesIO()
    writer = PdfWriter()
    writer.add_blank_page(200, 200)
    writer.write(blank)
    with pytest.raises(attachment_content.Unreadable, match="no text to extract"):
        attachment_content.inspect(blank.getvalue())
    locked = io.BytesIO()
    writer.encrypt("secret")
    writer.write(locked)
    with pytest.raises(attachment_content.Unreadable, match="password-protected"):
        attachment_content.inspect(locked.getvalue())


# --- what the model is sent ---------------------------------------------------------------------


def make(owner, name: str, data: bytes, message=None) -> Attachment:
    attachment = store_upload(owner, name, len(data), attachment_content.inspect(data))
    if message is not None:
        attachment.message = message
        attachment.save()
    return attachment


def test_documents_go_before_the_words_delimited_and_images_as_data_url_parts(alice):
    notes = make(alice, "notes.md", b"# Plan\nship it")
    picture = make(alice, "photo.png", files.image(10, 10))
    assert upstream_content("What now?", [notes], images=True) == (
        '<attachment name="notes.md">\n# Plan\nship it\n</attachment>\n\nWhat now?'
    )
    parts = upstream_content("Look", [notes, picture], images=True)
    assert parts[0] == {"type": "text", "text": '<attachment name="notes.md">\n# Plan\nship it\n</attachment>\n\nLook'}
    assert parts[1]["type"] == "image_url"
    url = parts[1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == picture.read()
    # A model that takes no images (earlier turns, after the model was changed): a note instead.
    assert upstream_content("Look", [picture], images=False) == (
        "[An image, photo.png, was attached here; this model does not accept images.]\n\nLook"
    )


@override_settings(ATTACHMENT_QUOTA_BYTES=30_000)
def test_the_storage_quota_counts_every_attachment_of_the_owner(alice, bob):
    make(alice, "a.txt", b"a" * 12_000)  # 12 kB of file + 12 kB of text
    with pytest.raises(Exception, match="over your storage quota") as refused:
        make(alice, "b.txt", b"b" * 4_000)
    assert refused.value.code == "quota_exceeded"
    make(bob, "b.txt", b"b" * 4_000)  # bob has his own
    Attachment.objects.filter(owner=alice).delete()
    make(alice, "b.txt", b"b" * 4_000)


@pytest.mark.parametrize("storage", ["database", "files"])
def test_attachments_are_stored_by_setting_and_deleted_with_their_conversation(alice, tmp_path, storage):
    stores = {
        **settings.STORAGES,
        "attachments": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": tmp_path}},
    }
    with override_settings(ATTACHMENT_STORAGE=storage, STORAGES=stores):
        conversation = Conversation.objects.create(owner=alice, title="t")
        message = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="see")
        picture = make(alice, "photo.png", files.image(20, 20), message)
        on_disk = [p for p in tmp_path.rglob("*") if p.is_file()]
        if storage == "files":
            assert picture.data is None and len(on_disk) == 1 and on_disk[0].read_bytes() == picture.read()
            assert "photo" not in str(on_disk[0])  # stored under a random name, never the user's
        else:
            assert bytes(picture.data) == picture.read() and on_disk == []
        conversation.delete()
        assert not Attachment.objects.exists()
        assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


# --- over HTTP, against the real server -----------------------------------------------------------


def browser_client(server, user) -> httpx.Client:
    """An httpx client with the user's session and the page's CSRF token, as the page's fetch() has."""
    client = httpx.Client(base_url=server.url, timeout=60)
    client.cookies.set(settings.SESSION_COOKIE_NAME, session_cookie(user))
    page = client.get("/")
    client.headers["X-CSRFToken"] = re.search(r'"csrfToken": "([^"]+)"', page.text).group(1)
    return client


def upload(client: httpx.Client, name: str, data: bytes, content_type: str = "application/octet-stream"):
    return client.post("/api/attachments", files={"file": (name, data, content_type)})


def test_upload_answers_the_chip_and_download_is_never_a_page(server, alice, bob):
    with closing(browser_client(server, alice)) as client:
        answer = upload(client, "report.pdf", files.pdf("Revenue grew"), "application/pdf")
        assert answer.status_code == 201, answer.text
        chip = answer.json()
        assert chip | {"id": 0} == {
            "id": 0, "name": "report.pdf", "kind": "document", "size": len(files.pdf("Revenue grew")), "tokens": 3,
            "content_type": "application/pdf", "width": None, "height": None, "url": f"/api/attachments/{chip['id']}",
        }  # fmt: skip
        # HTML in a text file: downloaded, never rendered from our origin.
        html = upload(client, "page.html", b"<script>alert(document.cookie)</script>").json()
        got = client.get(html["url"])
        assert got.status_code == 200 and got.content == b"<script>alert(document.cookie)</script>"
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.headers["content-disposition"] == 'attachment; filename="page.html"'
        assert got.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in got.headers["content-security-policy"]
        picture = upload(client, "shot.png", files.image(30, 20)).json()
        got = client.get(picture["url"])
        assert got.headers["content-type"] == "image/png" and got.headers["content-disposition"].startswith("attach")
        assert Image.open(io.BytesIO(got.content)).size == (30, 20)
        # Past REQUEST_MAX_BYTES (2.5 MB), which every other path keeps: uploads may be up to 20 MB.
        large = files.noise(1000, 1000)
        assert len(large) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        assert upload(client, "noise.png", large).status_code == 201
        assert client.post("/api/budget", content=large).status_code == 413
        # A name past the multipart parser's header limit: the JSON error the page shows, not Django's bare 400.
        named = upload(client, "n" * 5000 + ".txt", b"hello")
        assert named.status_code == 400 and named.json()["error"]["code"] == "bad_upload"
        # Without the CSRF token: refused.
        del client.headers["X-CSRFToken"]
        assert upload(client, "x.txt", b"hello").status_code == 403
    with closing(browser_client(server, bob)) as other:
        assert other.get(chip["url"]).status_code == 404  # another user's: as if it did not exist
        assert other.delete(chip["url"]).status_code == 404
    assert httpx.get(server.url + chip["url"]).status_code == 401


@pytest.mark.parametrize(
    ("name", "data", "status", "error"),
    [
        ("broken.pdf", files.pdf("x")[:120], 400, "broken.pdf: The PDF could not be read"),
        ("photo.jpg", files.image(200, 200, "JPEG")[:200], 400, "photo.jpg: The image could not be read"),
        ("program.exe", b"MZ\x90\x00\x03" + bytes(200), 400, "This file type is not supported"),
        ("empty.txt", b"", 400, "empty.txt is empty"),
    ],
)
def test_unreadable_uploads_are_refused_with_a_sentence(server, alice, name, data, status, error):
    with closing(browser_client(server, alice)) as client:
        answer = upload(client, name, data)
        assert answer.status_code == status and error in answer.json()["error"]["detail"]
        assert upload(client, "fine.txt", b"still works").status_code == 201
    assert Attachment.objects.count() == 1


def test_an_unreadable_upload_is_explained_in_the_persons_language(server, alice):
    """The reading runs in a child process with no request: its sentence is translated when the answer is made."""
    with closing(browser_client(server, alice)) as client:
        client.headers["Accept-Language"] = "fr"
        answer = upload(client, "program.png", b"MZ\x90\x00\x03" + bytes(200))
        assert "program.png: Ce type de fichier n’est pas pris en charge" in answer.json()["error"]["detail"]
        answer = upload(client, "broken.pdf", files.pdf("x")[:120])
        detail = answer.json()["error"]["detail"]
        assert detail.startswith("broken.pdf: Le PDF n’a pas pu être lu (il semble endommagé ou tronqué : "), detail


@pytest.fixture(scope="module")
def limited(django_db_setup, django_db_blocker):
    """A second server with small attachment limits (50 kB a file, 80 kB a message, 2,000 tokens)."""
    from django.db import connection

    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "ATTACHMENT_MAX_FILE_BYTES": "50000",
        "ATTACHMENT_MAX_MESSAGE_BYTES": "80000",
        "ATTACHMENT_MAX_MESSAGE_TOKENS": "2000",
        "ATTACHMENT_QUOTA_BYTES": "400000",
    }
    with LiveServer(env) as live:
        yield live


def test_limits_per_file_tokens_and_the_transports_413(limited, alice, providers):
    with closing(browser_client(limited, alice)) as client:
        over = upload(client, "big.txt", b"a" * 50_001)  # in the transport's margin: Django answers
        assert over.status_code == 413 and "over the limit of 50 KB per file" in over.json()["error"]["detail"]
        far = upload(client, "huge.txt", b"a" * 200_000)  # past the margin: cut by the server as it arrives
        assert far.status_code == 413 and far.text.startswith("The request body is larger than")
        wordy = upload(client, "long.txt", b"word " * 2_000)
        assert wordy.status_code == 400 and wordy.json()["error"]["code"] == "too_many_tokens"
        assert "about 2,500 tokens, over the limit of 2,000" in wordy.json()["error"]["detail"]
        # Any other path keeps REQUEST_MAX_BYTES.
        assert client.post("/api/budget", content=b"x" * 3_000_000).status_code == 413
    assert not Attachment.objects.exists()


async def test_send_with_attachments_checks_them_and_ties_them_to_the_message(connect, alice, bob, providers, fake):
    from asgiref.sync import sync_to_async

    notes = await sync_to_async(make)(alice, "notes.txt", b"the plan")
    picture = await sync_to_async(make)(alice, "photo.png", files.image(16, 16))
    bobs = await sync_to_async(make)(bob, "bob.txt", b"bob's")
    _, _, socket = await connect(alice)
    await socket.send(type="send", conversation=None, content="", model=CLAUDE, attachments=[picture.pk])
    refused = await socket.until("error")
    assert refused[-1]["code"] == "images_not_supported"
    assert "claude-sonnet-5 does not accept images" in refused[-1]["detail"]
    await socket.send(type="send", conversation=None, content="x", model=CLAUDE, attachments=[bobs.pk])
    assert (await socket.until("error"))[-1]["code"] == "not_found"  # someone else's upload
    await socket.send(type="send", conversation=None, content="x", model=CLAUDE, attachments=["1"])
    assert (await socket.until("error"))[-1]["code"] == "bad_field"
    assert not await Conversation.objects.aexists() and not fake.app.streams
    # A message of attachments alone is fine; the conversation is named after the first.
    await socket.send(type="send", conversation=None, content="", model=CLAUDE, attachments=[notes.pk])
    started = (await socket.until("started"))[-1]
    assert started["title"] == "notes.txt"
    await socket.until("done")
    sent = fake.app.last().body["messages"][-1]
    assert sent == {"role": "user", "content": '<attachment name="notes.txt">\nthe plan\n</attachment>'}
    await notes.arefresh_from_db()
    assert notes.message_id == started["user_message"]
    # Sent once: the same id again is not found.
    await socket.send(type="send", conversation=None, content="again", model=CLAUDE, attachments=[notes.pk])
    assert (await socket.until("error"))[-1]["code"] == "not_found"
    # An edit of the words keeps the attachments, and so does a regenerate.
    await socket.send(type="edit", message=started["user_message"], content="Summarise it")
    await socket.until("done")
    expected = '<attachment name="notes.txt">\nthe plan\n</attachment>\n\nSummarise it'
    assert fake.app.last().body["messages"][-1]["content"] == expected
    await socket.send(type="regenerate", conversation=started["conversation"])
    await socket.until("done")
    assert fake.app.last().body["messages"][-1]["content"] == expected
    assert await Attachment.objects.filter(message_id=started["user_message"]).acount() == 1


@override_settings(ATTACHMENT_MAX_MESSAGE_BYTES=3000, ATTACHMENT_MAX_MESSAGE_TOKENS=300)
async def test_send_refuses_a_message_over_its_limits(connect, alice, providers, fake):
    from asgiref.sync import sync_to_async

    first = await sync_to_async(make)(alice, "a.txt", b"a" * 100)
    second = await sync_to_async(make)(alice, "b.png", files.noise(40, 40))  # ~5 kB, 255 tokens
    _, _, socket = await connect(alice)
    await socket.send(type="send", conversation=None, content="hi", model=GPT, attachments=[first.pk, second.pk])
    error = (await socket.until("error"))[-1]
    assert error["code"] == "attachments_too_large" and "per message" in error["detail"]
    await socket.send(type="send", conversation=None, content="word " * 300, model=GPT, attachments=[first.pk])
    error = (await socket.until("error"))[-1]  # 375 tokens of words and 25 of the document
    assert error["code"] == "too_many_tokens" and "about 400 tokens, over the limit of 300" in error["detail"]
    assert not fake.app.streams


# --- /v1: image parts through the OpenAI SDK -----------------------------------------------------


@pytest.fixture
def sdk(server, alice, providers):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=ApiToken.issue(alice, "t")[1], max_retries=0)


def image_message(url: str) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
    ]}]  # fmt: skip


def test_v1_forwards_image_parts_to_image_models_and_meters_them(sdk, providers, fake, alice):
    providers["api14"].image_models = GPT
    providers["api14"].save()
    url = "data:image/png;base64," + base64.b64encode(files.image(8, 8)).decode()
    answer = sdk.chat.completions.create(model=GPT, messages=image_message(url))
    assert answer.choices[0].message.content
    assert fake.app.last().body["messages"] == image_message(url)  # forwarded as sent
    stream = sdk.chat.completions.create(model=GPT, messages=image_message("https://example.com/a.png"), stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert fake.app.last().body["messages"][0]["content"][1]["image_url"]["url"] == "https://example.com/a.png"
    from chat.models import Usage

    assert Usage.objects.filter(user=alice, source=Usage.Source.API, status="complete").count() == 2


def test_v1_takes_a_phone_photo_as_a_data_url_past_the_pages_body_limit(sdk, providers, fake, settings):
    """A 5 MB photo is 6.7 MB of base64, past REQUEST_MAX_BYTES (2.5 MB): it was refused with 413 although images
    of up to ATTACHMENT_MAX_FILE_BYTES are accepted. The media type's case does not matter either."""
    providers["api14"].image_models = GPT
    providers["api14"].save()
    photo = base64.b64encode(files.image(8, 8) + b"\0" * 5_000_000).decode()
    assert len(photo) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    for media in ("image/png", "image/PNG"):
        answer = sdk.chat.completions.create(model=GPT, messages=image_message(f"data:{media};base64,{photo}"))
        assert answer.choices[0].message.content
        assert fake.app.last().body["messages"][0]["content"][1]["image_url"]["url"].endswith(photo[-20:])
    # Past API_MAX_BODY_BYTES, the body is refused as it arrives, in OpenAI's shape.
    huge = "A" * (settings.API_MAX_BODY_BYTES + 1)
    with pytest.raises(openai.APIStatusError) as refused:
        sdk.chat.completions.create(model=GPT, messages=image_message(f"data:image/png;base64,{huge}"))
    assert refused.value.status_code == 413 and refused.value.body["code"] == "request_too_large"


def test_v1_refuses_images_for_other_models_and_oversized_or_odd_image_parts(sdk, providers, fake):
    url = "data:image/png;base64," + base64.b64encode(files.image(8, 8)).decode()
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=CLAUDE, messages=image_message(url))
    assert refused.value.body["code"] == "images_not_supported"
    providers["infyrence"].image_models = "*"
    providers["infyrence"].save()
    for bad, param in [
        ("data:text/html;base64,PHNjcmlwdD4=", "messages[0].content[1]"),
        ("javascript:alert(1)", "messages[0].content[1]"),
        ("http://169.254.169.254/latest", "messages[0].content[1]"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(model=CLAUDE, messages=image_message(bad))
        assert refused.value.body["param"] == param
    assert not fake.app.streams


def test_v1_image_parts_are_size_limited(limited, alice, providers, fake):
    providers["api14"].image_models = "*"
    providers["api14"].save()
    client = openai.OpenAI(base_url=limited.url + "/v1", api_key=ApiToken.issue(alice, "t")[1], max_retries=0)
    over = "data:image/png;base64," + base64.b64encode(bytes(60_000)).decode()  # 60 kB > 50 kB a file
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=GPT, messages=image_message(over))
    assert refused.value.body["code"] == "image_too_large"
    fits = "data:image/png;base64," + base64.b64encode(files.image(8, 8)).decode()
    client.chat.completions.create(model=GPT, messages=image_message(fits))
    assert fake.app.last().body["messages"] == image_message(fits)


def test_the_admin_shows_a_messages_attachments_and_staff_may_download_them(alice, django_user_model, client):
    conversation = Conversation.objects.create(owner=alice, title="with files")
    message = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="see")
    report = make(alice, "report.pdf", files.pdf("Revenue grew"), message)
    staff = django_user_model.objects.create_superuser("root", password="root-secret-pw")
    client.force_login(staff)
    page = client.get(f"/admin/chat/conversation/{conversation.pk}/change/")
    assert f'<a href="/api/attachments/{report.pk}">report.pdf</a>' in page.content.decode()
    detail = client.get(f"/admin/chat/attachment/{report.pk}/change/").content.decode()
    assert "Revenue grew" in detail  # the text the model was sent
    download = client.get(f"/api/attachments/{report.pk}")
    assert download.status_code == 200 and download.content == files.pdf("Revenue grew")
    assert download["Content-Disposition"] == 'attachment; filename="report.pdf"'


def test_s3_storage_is_configured_from_the_environment():
    """ATTACHMENT_STORAGE=s3 builds django-storages' S3 backend from AWS_* (no S3 service is reached)."""
    import os
    import subprocess
    import sys

    from tests.live import ROOT

    script = (
        "import django; django.setup(); from django.core.files.storage import storages; "
        "s = storages['attachments']; print(type(s).__name__, s.bucket_name, s.endpoint_url, s.location, "
        "s.default_acl, s.querystring_auth)"
    )
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "chatsite.settings", "ATTACHMENT_STORAGE": "s3",
        "AWS_STORAGE_BUCKET_NAME": "chat-files", "AWS_S3_ENDPOINT_URL": "https://minio.internal:9000",
    }  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["S3Storage", "chat-files", "https://minio.internal:9000", "attachments", "private",
                                  "True"], out.stderr  # fmt: skip
    env["ATTACHMENT_STORAGE"] = "ftp"
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
    assert "ATTACHMENT_STORAGE must be database, files or s3" in out.stderr


async def test_attachments_go_in_the_order_they_were_attached_not_uploaded(connect, alice, providers, fake):
    from asgiref.sync import sync_to_async

    uploaded_first = await sync_to_async(make)(alice, "second.txt", b"two")
    uploaded_last = await sync_to_async(make)(alice, "first.txt", b"one")
    _, _, socket = await connect(alice)
    order = [uploaded_last.pk, uploaded_first.pk]
    await socket.send(type="send", conversation=None, content="go", model=CLAUDE, attachments=order)
    await socket.until("done")
    assert fake.app.last().body["messages"][-1]["content"] == (
        '<attachment name="first.txt">\none\n</attachment>\n\n<attachment name="second.txt">\ntwo\n</attachment>\n\ngo'
    )


def test_a_word_document_with_broken_xml_says_so_without_python_internals():
    import zipfile

    broken = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(files.docx("x"))) as original, zipfile.ZipFile(broken, "w") as copy:
        for item in original.infolist():
            data = original.read(item)
            copy.writestr(item, b"<w:document><unclosed>" if item.filename == "word/document.xml" else data)
    with pytest.raises(attachment_content.Unreadable) as refused:
        attachment_content.inspect_limited(broken.getvalue(), timeout=20)
    assert str(refused.value) == "The Word document could not be read: it looks damaged, or is not a .docx file."
