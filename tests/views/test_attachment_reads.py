"""Staff reading an attachment, in the admin or as a download, is recorded like a conversation's read (issue 35)."""

import pytest

from chat.actions.attachments import store_upload
from chat.lib import attachment_content
from chat.models import Conversation, ConversationRead, Message
from tests import files

pytestmark = pytest.mark.django_db


def make(owner, name: str, data: bytes, message=None):
    attachment = store_upload(owner, name, len(data), attachment_content.inspect(data))
    if message is not None:
        attachment.message = message
        attachment.save()
    return attachment


def test_staff_reads_of_an_attachment_are_recorded(alice, django_user_model, client):
    conversation = Conversation.objects.create(owner=alice, title="with files")
    message = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="see")
    report = make(alice, "report.pdf", files.pdf("Revenue grew"), message)
    unsent = make(alice, "draft.txt", b"not sent yet")
    staff = django_user_model.objects.create_superuser("root", password="root-secret-pw")
    client.force_login(staff)

    assert "Revenue grew" in client.get(f"/admin/chat/attachment/{report.pk}/change/").content.decode()
    read = ConversationRead.objects.get()
    assert (read.conversation, read.owner, read.reader, read.where) == (conversation, alice, staff, "admin attachment")
    assert read.title == "report.pdf (attachment of “with files”)"

    assert client.get(f"/api/attachments/{report.pk}").status_code == 200
    assert client.get(f"/api/attachments/{unsent.pk}").status_code == 200
    downloads = ConversationRead.objects.filter(where="attachment download").order_by("pk")
    assert [(r.conversation, r.title, r.owner) for r in downloads] == [
        (conversation, "report.pdf (attachment of “with files”)", alice),
        (None, "draft.txt", alice),
    ]


def test_the_owners_own_reads_are_not_recorded(alice, client):
    alice.is_staff = alice.is_superuser = True
    alice.save()
    mine = make(alice, "notes.txt", b"mine")
    client.force_login(alice)
    assert client.get(f"/admin/chat/attachment/{mine.pk}/change/").status_code == 200
    assert client.get(f"/api/attachments/{mine.pk}").status_code == 200
    assert not ConversationRead.objects.exists()
