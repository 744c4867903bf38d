"""The chat app's models, one module per concern, re-exported here where Django and the code expect them.

- providers: the upstreams and their models
- access: which groups may use which models, and each group's defaults
- conversations: conversations and their messages (a turn's start: chat/actions/turns.py)
- tokens: personal API tokens
- invites: single-use links to join
- usage: one row per stream, metered
- rollups: the usage rows' daily sums, kept by triggers (chat/metering/summary_triggers.py), for the dashboard
- workers: one lease per serving process
- attachments: uploaded files, sent with a message
- folders: a person's folders of conversations (pin and archive are fields of Conversation)
- reviews: reads of a conversation by someone other than its owner
- shares: read-only links to a conversation
- presets: a person's prompt presets and defaults for a new chat
- budgets: prices per model and monthly budgets
- responses: /v1/responses answers kept for a follow-up's previous_response_id
- tools: MCP servers, their tools' settings and the calls made (docs/tools.md)
"""

from chat.models.access import Access, GroupDefaults, ModelAccess, access_of
from chat.models.attachments import Attachment, AttachmentQuerySet
from chat.models.base import ChatError, Status, fit, insert_row, update_row
from chat.models.budgets import Budget, Price
from chat.models.conversations import Conversation, ConversationQuerySet, Message, MessageQuerySet
from chat.models.folders import Folder, FolderQuerySet
from chat.models.invites import Invite, InviteQuerySet
from chat.models.presets import ChatDefaults, PromptPreset, PromptPresetQuerySet
from chat.models.providers import DEMO_MODEL, DEMO_PROVIDER, Provider, ProviderQuerySet, demo_api_key
from chat.models.responses import StoredResponse, StoredResponseQuerySet
from chat.models.reviews import ConversationRead, ConversationReadQuerySet
from chat.models.rollups import PersonDay, PersonMonth, TokenMonth, UsageDay
from chat.models.shares import Share, ShareQuerySet
from chat.models.tokens import TOKEN_PREFIX, ApiToken, ApiTokenQuerySet
from chat.models.tools import McpServer, McpServerQuerySet, McpTool, ToolCall, tool_name
from chat.models.usage import Usage, UsageQuerySet
from chat.models.workers import INTERRUPTED_ERROR, Worker, WorkerQuerySet

__all__ = [
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
    "McpServer",
    "McpServerQuerySet",
    "McpTool",
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
    "Status",
    "StoredResponse",
    "StoredResponseQuerySet",
    "TokenMonth",
    "ToolCall",
    "Usage",
    "UsageDay",
    "UsageQuerySet",
    "Worker",
    "WorkerQuerySet",
    "access_of",
    "demo_api_key",
    "fit",
    "insert_row",
    "tool_name",
    "update_row",
]
