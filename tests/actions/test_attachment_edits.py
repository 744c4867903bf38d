"""An edited message's copies of its attachments count in the storage quota like uploads (issue 35)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import override_settings

from chat.actions.attachments import store_upload
from chat.lib import attachment_content
from chat.models import Attachment
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)


def upload(owner, name: str, data: bytes) -> Attachment:
    return store_upload(owner, name, len(data), attachment_content.inspect(data))


@pytest.mark.parametrize("storage", ["database", "files"])
async def test_an_edit_over_the_quota_is_refused_and_copies_nothing(connect, alice, providers, fake, storage, tmp_path):
    stores = {
        **settings.STORAGES,
        "attachments": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": tmp_path}},
    }
    with override_settings(ATTACHMENT_QUOTA_BYTES=60_000, ATTACHMENT_STORAGE=storage, STORAGES=stores):
        notes = await sync_to_async(upload)(alice, "notes.txt", b"n" * 12_000)  # 24 kB with its text
        _, _, socket = await connect(alice)
        await socket.send(type="send", conversation=None, content="", model=MODELS["infyrence"], attachments=[notes.pk])
        started = (await socket.until("started"))[-1]
        await socket.until("done")
        # One edit fits (48 kB in all), the next would take 72 kB: refused like an upload.
        await socket.send(type="edit", message=started["user_message"], content="Summarise it")
        await socket.until("done")
        assert await Attachment.objects.filter(owner=alice).acount() == 2
        await socket.send(type="edit", message=started["user_message"], content="Shorter")
        error = (await socket.until("error"))[-1]
        assert error["code"] == "quota_exceeded" and "72 KB, over your storage quota of 60 KB" in error["detail"]
        assert await Attachment.objects.filter(owner=alice).acount() == 2
        if storage == "files":
            assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == 2
