"""The conversation's admin page laid out like the chat: every branch, in order, its forks labelled."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.utils.translation import gettext as _

from chat.models import Conversation, Message


@dataclass
class ReviewRow:
    message: Message
    depth: int  # how many forks above it: its indent
    branch: str  # "Branch 2 of 3" on the first message of a sibling, else ""
    on_path: bool  # on the branch the person last chose (the one the chat shows and sends upstream)
    usage: str = ""  # the answer's usage as the chat shows it, linked to its row (HTML, filled by the admin)
    attachments: str = ""


def shown(request, response) -> bool:
    """Whether an admin page's response showed its content: any method but HEAD, a form refused and shown again too.

    Django's admin renders a change page for OPTIONS as for GET, and a refused POST shows the page again.
    """
    return response.status_code == 200 and request.method != "HEAD"


def review_rows(conversation: Conversation) -> list[ReviewRow]:
    """The tree depth first, oldest sibling first; a linear run stays at one depth, a fork indents its branches."""
    messages = conversation.messages.prefetch_related("usages", "attachments")
    children: dict[int | None, list[Message]] = defaultdict(list)
    for message in messages:
        children[message.parent_id].append(message)
    on_path = set(conversation.path_ids())
    rows: list[ReviewRow] = []
    stack: list[tuple[Message, int, str]] = []

    def push(parent_id: int | None, depth: int) -> None:
        kids = children.get(parent_id, [])
        if len(kids) == 1:
            stack.append((kids[0], depth, ""))
            return
        for number, kid in reversed(list(enumerate(kids, 1))):  # popped oldest first
            label = _("Branch %(number)s of %(count)s") % {"number": number, "count": len(kids)}
            stack.append((kid, depth + 1, label))

    push(None, 0)
    while stack:
        message, depth, branch = stack.pop()
        rows.append(ReviewRow(message, depth, branch, message.pk in on_path))
        push(message.pk, depth)
    return rows
