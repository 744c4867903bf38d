"""Staff views, one module per concern; Django's admin autodiscovery imports this package.

- providers: the upstreams (write-only keys, models limited to groups, health)
- conversations: conversations with their messages and attachments, and who read them
- usage: usage rows with totals, prices, budgets
- accounts: API tokens, budgets and chat defaults on the user and group pages, invites
- presets: prompt presets (staff publish them to everyone) and personal defaults for a new chat
"""

from . import accounts, conversations, presets, providers, usage

__all__ = ["accounts", "conversations", "presets", "providers", "usage"]
