"""Uploads in flight: each person's are capped (429 with a sentence), large ones spooled to disk (issue 35)."""

from __future__ import annotations

import asyncio

import pytest
from django.conf import settings
from django.core.files.uploadedfile import TemporaryUploadedFile
from django.test import AsyncClient, override_settings

from chat.models import Attachment
from chat.views import attachments

pytestmark = pytest.mark.django_db(transaction=True)


class HeldTurns:
    """Stands in for the reading turns (anyone's): every upload waits at its turn until released."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.waiting = 0
        self.arrived = asyncio.Condition()

    async def __aenter__(self):
        async with self.arrived:
            self.waiting += 1
            self.arrived.notify_all()
        await self.released.wait()

    async def __aexit__(self, *exc):
        return False

    async def until_waiting(self, count: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: self.waiting >= count)


async def signed_in(user) -> AsyncClient:
    client = AsyncClient()
    await client.aforce_login(user)
    return client


def post(client: AsyncClient, name: str, data: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post("/api/attachments", {"file": SimpleUploadedFile(name, data)})


@override_settings(ATTACHMENT_MAX_UPLOADS_IN_FLIGHT=2)
async def test_a_persons_uploads_in_flight_are_capped(alice, bob, monkeypatch):
    turns = HeldTurns()
    monkeypatch.setattr(attachments, "reading_turn", lambda user_id: turns)
    mine, theirs = await signed_in(alice), await signed_in(bob)
    held = [asyncio.create_task(post(mine, f"{n}.txt", b"notes %d" % n)) for n in range(2)]
    async with asyncio.timeout(30):
        await turns.until_waiting(2)
    refused = await post(mine, "third.txt", b"one too many")
    assert refused.status_code == 429
    assert refused.json()["error"] == {
        "code": "too_many_uploads",
        "detail": "You have 2 uploads in progress; wait for one to finish, then attach more.",
    }
    bobs = asyncio.create_task(post(theirs, "bob.txt", b"bob's own"))  # someone else's are counted apart
    async with asyncio.timeout(30):
        await turns.until_waiting(3)
    turns.released.set()
    async with asyncio.timeout(60):
        answers = await asyncio.gather(*held, bobs)
    assert [a.status_code for a in answers] == [201, 201, 201]
    assert attachments._in_flight == {}  # every one counted out again
    assert (await post(mine, "now.txt", b"room again")).status_code == 201
    assert await Attachment.objects.filter(owner=alice).acount() == 3


async def test_one_persons_files_are_read_one_at_a_time_leaving_the_other_slots_to_others(monkeypatch):
    """A person's four crafted PDFs, each taking the whole time limit, held every reading slot of a 2-core
    server: someone else's small file waited 43 s. Now one of a person's is read at a time."""
    monkeypatch.setattr(attachments, "_reading", asyncio.Semaphore(2))
    first, second = attachments.reading_turn(1), attachments.reading_turn(1)
    await first.__aenter__()
    waiting = asyncio.create_task(second.__aenter__())
    await asyncio.sleep(0)  # it runs up to its wait
    async with asyncio.timeout(10):
        async with attachments.reading_turn(2):  # the free slot is someone else's to take
            assert not waiting.done()
    await first.__aexit__(None, None, None)
    async with asyncio.timeout(10):
        await waiting  # the person's next file, once their first is read
    await second.__aexit__(None, None, None)
    assert not attachments._readers  # forgotten once no one holds or waits for it


def test_a_large_upload_is_spooled_to_disk_not_held_in_memory(rf):
    from django.core.files.uploadhandler import load_handler
    from django.http.multipartparser import MultiPartParser

    assert settings.FILE_UPLOAD_MAX_MEMORY_SIZE <= 262_144
    boundary = "b0undary"
    data = b"x" * 1_000_000
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = rf.post("/api/attachments", body, content_type=f"multipart/form-data; boundary={boundary}")
    handlers = [load_handler(path, request) for path in settings.FILE_UPLOAD_HANDLERS]
    _, files = MultiPartParser(request.META, request, handlers).parse()
    assert isinstance(files["file"], TemporaryUploadedFile) and files["file"].size == len(data)
