"""The chat app's models, one module per concern, re-exported here where Django and the code expect them.

- providers: the upstreams and their models
- conversations: conversations, messages and the start of a turn
- tokens: personal API tokens
- usage: one row per stream, metered
- workers: one lease per serving process
- attachments: uploaded files, sent with a message
- chat/budgets.py: prices and monthly budgets (their models are re-exported here too)
"""

from ..budgets import Budget, Limit, Price, Spent, budget_for, month_start, price_unpriced, priced, spent
from .attachments import Attachment, AttachmentQuerySet
from .base import ChatError, Status, fit
from .conversations import Conversation, ConversationQuerySet, Message, MessageQuerySet, Turn, begin_turn
from .providers import (
    DEMO_MODEL,
    DEMO_PROVIDER,
    CatalogEntry,
    Provider,
    ProviderQuerySet,
    client,
    demo_api_key,
    stream_state,
    timeouts,
)
from .tokens import TOKEN_PREFIX, ApiToken, ApiTokenQuerySet
from .usage import Usage, UsageQuerySet
from .workers import INTERRUPTED_ERROR, Worker, WorkerQuerySet

__all__ = [
    "DEMO_MODEL",
    "DEMO_PROVIDER",
    "INTERRUPTED_ERROR",
    "TOKEN_PREFIX",
    "ApiToken",
    "ApiTokenQuerySet",
    "Attachment",
    "AttachmentQuerySet",
    "Budget",
    "CatalogEntry",
    "ChatError",
    "Conversation",
    "ConversationQuerySet",
    "Limit",
    "Message",
    "MessageQuerySet",
    "Price",
    "Provider",
    "ProviderQuerySet",
    "Spent",
    "Status",
    "Turn",
    "Usage",
    "UsageQuerySet",
    "Worker",
    "WorkerQuerySet",
    "begin_turn",
    "budget_for",
    "client",
    "demo_api_key",
    "fit",
    "month_start",
    "price_unpriced",
    "priced",
    "spent",
    "stream_state",
    "timeouts",
]
