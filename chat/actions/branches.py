"""The branches of a conversation's message tree: switching the one shown, and deleting a message pair.

Regenerating and editing (new siblings) and continuing (the same answer, longer) start a turn:
begin_turn in chat/actions/turns.py.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from chat.models.base import ChatError
from chat.models.conversations import Conversation, Message


def _owned_message(user, message_id: int) -> tuple[Conversation, Message]:
    """The message and its conversation, locked; not_found for anyone else's; busy while a reply streams."""
    message = Message.objects.filter(pk=message_id, conversation__owner=user).first()
    if message is None:
        raise ChatError("not_found", _("No such message."))
    conversation = Conversation.objects.select_for_update().get(pk=message.conversation_id)
    if conversation.messages.streaming().exists():
        raise ChatError("busy", _("A reply is still streaming in this conversation; stop it first."))
    return conversation, message


def switch(user, message_id: int) -> Conversation:
    """Show the branch through `message_id`, down to its deepest message as it was last shown (Conversation.deepest)."""
    with transaction.atomic():
        conversation, message = _owned_message(user, message_id)
        conversation.show(conversation.deepest(message.pk))
    return conversation


def delete_pair(user, message_id: int) -> Conversation:
    """Delete a user message and its answers (`message_id` is either), keeping what followed.

    The messages after the pair (the children of its answers) move up to follow the pair's parent,
    so the rest of the branch stays, as in ChatGPT; the pair's other answers (regenerated ones)
    go with it, their own followers kept the same way. Usage rows stay, unlinked (SET_NULL).
    If the branch shown ended in the pair, the one before it is shown.
    """
    with transaction.atomic():
        conversation, message = _owned_message(user, message_id)
        asked = message.parent if message.role == Message.Role.ASSISTANT else message
        if asked is None or asked.role != Message.Role.USER:
            raise ChatError("not_pair", _("Only a message and its answer can be deleted together."))
        answers = list(asked.children.values_list("pk", flat=True))
        gone = {asked.pk, *answers}
        Message.objects.filter(parent_id__in=answers).update(parent_id=asked.parent_id)
        if conversation.current_id in gone or conversation.current_id is None:
            conversation.current_id = asked.parent_id
        Message.objects.filter(pk__in=gone).delete()
        if conversation.current_id is None:
            newest = conversation.messages.filter(parent__isnull=True).order_by("created", "pk").last()
            conversation.current_id = conversation.deepest(newest.pk) if newest else None
        conversation.updated = timezone.now()
        conversation.save(update_fields=["current", "updated"])
    return conversation
