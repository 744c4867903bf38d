"""The chat app's models, one module per concern, re-exported here where Django and the code expect them.

- providers: the upstreams and their models
- access: which groups may use which models, and each group's defaults
- conversations: conversations, messages and the start of a turn
- branches: switching the branch shown, deleting a message pair
- tokens: personal API tokens
- invites: single-use links to join
- usage: one row per stream, metered
- rollups: the usage rows' daily sums, kept by triggers (chat/rollup.py), for the dashboard
- workers: one lease per serving process
- attachments: uploaded files, sent with a message
- folders: a person's folders of conversations (pin and archive are fields of Conversation)
- reviews: reads of a conversation by someone other than its owner
- shares: read-only links to a conversation
- presets: a person's prompt presets and defaults for a new chat
- chat/budgets.py: prices and monthly budgets (their models are re-exported here too)
"""

from ..budgets import Budget, Limit, Price, Spent, budget_for, month_start, price_unpriced, priced, spent
from .access import Access, GroupDefaults, ModelAccess, access_for, access_of
from .attachments import Attachment, AttachmentQuerySet
from .base import ChatError, Status, fit, insert_row, update_row
from .conversations import (
    CONTINUE_PROMPT,
    Conversation,
    ConversationQuerySet,
    Message,
    MessageQuerySet,
    Turn,
    begin_turn,
)
from .folders import Folder, FolderQuerySet
from .invites import Invite, InviteQuerySet
from .presets import ChatDefaults, PromptPreset, PromptPresetQuerySet
from .providers import (
    DEMO_MODEL,
    DEMO_PROVIDER,
    CatalogCold,
    CatalogEntry,
    Provider,
    ProviderQuerySet,
    cached_catalog,
    client,
    demo_api_key,
    resolve_in,
    stream_state,
    timeouts,
    with_catalog,
)
from .reviews import ConversationRead, ConversationReadQuerySet
from .rollups import PersonDay, PersonMonth, TokenMonth, UsageDay
from .shares import Share, ShareQuerySet
from .tokens import TOKEN_PREFIX, ApiToken, ApiTokenQuerySet
from .usage import Usage, UsageQuerySet
from .workers import INTERRUPTED_ERROR, Worker, WorkerQuerySet

__all__ = [
    "CONTINUE_PROMPT",
    "DEMO_MODEL",
    "DEMO_PROVIDER",
    "INTERRUPTED_ERROR",
    "TOKEN_PREFIX",
    "Access",
    "ApiToken",
    "ApiTokenQuerySet",
    "Attachment",
    "AttachmentQuerySet",
    "Budget",
    "CatalogCold",
    "CatalogEntry",
    "ChatDefaults",
    "ChatError",
    "Conversation",
    "ConversationQuerySet",
    "ConversationRead",
    "ConversationReadQuerySet",
    "Folder",
    "FolderQuerySet",
    "GroupDefaults",
    "Invite",
    "InviteQuerySet",
    "Limit",
    "Message",
    "MessageQuerySet",
    "ModelAccess",
    "PersonDay",
    "PersonMonth",
    "Price",
    "PromptPreset",
    "PromptPresetQuerySet",
    "Provider",
    "ProviderQuerySet",
    "Share",
    "ShareQuerySet",
    "Spent",
    "Status",
    "TokenMonth",
    "Turn",
    "Usage",
    "UsageDay",
    "UsageQuerySet",
    "Worker",
    "WorkerQuerySet",
    "access_for",
    "access_of",
    "begin_turn",
    "budget_for",
    "cached_catalog",
    "client",
    "demo_api_key",
    "fit",
    "insert_row",
    "month_start",
    "price_unpriced",
    "priced",
    "resolve_in",
    "spent",
    "stream_state",
    "timeouts",
    "update_row",
    "with_catalog",
]
