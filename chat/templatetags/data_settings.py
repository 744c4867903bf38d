"""The settings page's "Your data" section: the import's size limit, in bytes (for the page's check) and in MB."""

from django import template
from django.conf import settings

register = template.Library()


@register.simple_tag
def import_max_bytes() -> int:
    return settings.CHAT_IMPORT_MAX_BYTES


@register.simple_tag
def import_max_mb() -> str:
    return f"{settings.CHAT_IMPORT_MAX_BYTES / 1_000_000:g}"
