"""Share links: made with a snapshot of the branch shown (or live), and what the shared page shows."""

from __future__ import annotations

import secrets

from django.conf import settings

from chat.actions.exports import path_json
from chat.models import ChatError, Share


def create_share(conversation, *, live: bool, public: bool, show_usage: bool, show_name: bool = False) -> Share:
    """A new link; a snapshot copies the branch shown now. Public only where the setting allows it."""
    if public and not settings.CHAT_PUBLIC_SHARES:
        raise ChatError("public_shares_off", "Public links are turned off on this server (CHAT_PUBLIC_SHARES).")
    return Share.objects.create(
        conversation=conversation,
        owner_id=conversation.owner_id,
        token=secrets.token_urlsafe(24),
        live=live,
        public=public,
        show_usage=show_usage,
        show_name=show_name,
        snapshot=None if live else path_json(conversation),
    )


def shared_content(share: Share) -> dict:
    """What the shared page shows: the snapshot, or the branch shown now; usage left out unless chosen."""
    shown = share.snapshot if not share.live and share.snapshot is not None else path_json(share.conversation)
    # The messages, not the owner's instructions to the model: no system prompt, no params.
    shown = {key: value for key, value in shown.items() if key not in ("system_prompt", "params")}
    if not share.show_usage:
        shown = {**shown, "messages": [{**m, "usage": None} for m in shown["messages"]]}
    return shown
