"""Django's makemessages, also finding the page's t("…") and nt("…", "…", n) calls (static/chat/i18n.js)."""

from django.core.management.commands import makemessages


class Command(makemessages.Command):
    xgettext_options = [*makemessages.Command.xgettext_options, "--keyword=t", "--keyword=nt:1,2"]
