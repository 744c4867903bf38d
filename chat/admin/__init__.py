"""Staff views, one module per concern; Django's admin autodiscovery imports this package.

- providers: the upstreams (write-only keys, models limited to groups, health)
- conversations: conversations with their messages and attachments, and who read them
- usage: usage rows with totals, prices, budgets
- accounts: API tokens, budgets and chat defaults on the user and group pages, invites
- streams: live and orphaned streams told apart, stopped or marked interrupted; messages read-only
- presets: prompt presets (staff publish them to everyone) and personal defaults for a new chat
- tools: MCP servers (secrets write-only, groups, tools' settings, a connection test) and the tool calls made
"""

from chat.admin import accounts, conversations, presets, providers, streams, tools, usage

__all__ = ["accounts", "conversations", "presets", "providers", "streams", "tools", "usage"]
