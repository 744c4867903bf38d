"""What a conversation sends upstream: its branch shown, in OpenAI's message shape, with its attachments."""

from __future__ import annotations

from chat.models.attachments import Attachment
from chat.models.conversations import Conversation
from chat.streaming.tool_loop import stored_round_messages, stored_round_text


def upstream_messages(conversation: Conversation, *, images: bool = False, tools: bool = True) -> list[dict]:
    """The history in OpenAI's shape: system prompt, then every message with text or attachments.

    A user message's attachments go with it (chat/models/attachments.py): documents as
    delimited text before its words, images as image_url parts when `images` (the model accepts them).
    An answer that called tools goes as its calls and their results (tool messages) when `tools` (the model
    takes them); else as one message of text with each call noted in it: a provider may refuse tool messages
    in a request that offers no tools (Anthropic's API does), as after a switch to a model without them.
    """
    history: list[dict] = (
        [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    )
    attached: dict[int, list[Attachment]] = {}
    for attachment in Attachment.objects.filter(message__conversation=conversation):
        attached.setdefault(attachment.message_id, []).append(attachment)
    on_path = set(conversation.path_ids())
    rows = conversation.messages.filter(pk__in=on_path).values_list("pk", "role", "content", "tool_rounds")
    for pk, role, content, rounds in rows:
        if rounds and role == "assistant":  # an answer that called tools: its calls and their results, in order
            history += stored_round_messages(content, rounds) if tools else [stored_round_text(content, rounds)]
        elif pk in attached:
            history.append({"role": role, "content": upstream_content(content, attached[pk], images=images)})
        elif content:
            history.append({"role": role, "content": content})
    return history


def document_block(attachment: Attachment) -> str:
    """A document's text, delimited, with its name: the model can tell it apart from the user's words."""
    name = attachment.name.replace('"', "'")
    return f'<attachment name="{name}">\n{attachment.text}\n</attachment>'


def upstream_content(text: str, attachments: list[Attachment], *, images: bool) -> str | list[dict]:
    """A user message's content for the upstream: documents before the words, then the images as parts.

    images=False (a model that does not accept them, earlier in a conversation): each image
    becomes a one-line note instead, so the rest of the conversation can still go on.
    """
    blocks = [document_block(a) for a in attachments if a.kind == Attachment.Kind.DOCUMENT]
    pictures = [a for a in attachments if a.kind == Attachment.Kind.IMAGE]
    if pictures and not images:
        blocks += [f"[An image, {a.name}, was attached here; this model does not accept images.]" for a in pictures]
        pictures = []
    joined = "\n\n".join([*blocks, text] if text else blocks)
    if not pictures:
        return joined
    parts: list[dict] = [{"type": "text", "text": joined}] if joined else []
    parts += [{"type": "image_url", "image_url": {"url": a.data_url()}} for a in pictures]
    return parts
