"""`manage.py check --deploy`'s own warnings: what Django's checks cannot know is unsafe for this server."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Tags, Warning, register

PLACEHOLDER = "change-me"


@register(Tags.security, deploy=True)
def placeholders_left(app_configs, **kwargs) -> list[Warning]:
    """A value still holding deploy/env.production.example's placeholder, which anyone can read."""
    values = {
        "DJANGO_SECRET_KEY": settings.SECRET_KEY, "METRICS_TOKEN": settings.METRICS_TOKEN or "",
        "UPSTREAM_API_KEY": settings.UPSTREAM_API_KEY or "", "EMAIL_URL": settings.EMAIL_HOST_PASSWORD or "",
        "DATABASE_URL": str(settings.DATABASES["default"].get("PASSWORD") or ""),
    }  # fmt: skip
    return [
        Warning(f"{name} still holds the example's placeholder ({PLACEHOLDER}…).",
                hint="Fill in every change-me of deploy/env.production.example (docs/deploy.md).", id="chat.W001")
        for name, value in values.items() if PLACEHOLDER in value
    ]  # fmt: skip


@register(Tags.security, deploy=True)
def mail_printed(app_configs, **kwargs) -> list[Warning]:
    """With DEBUG off, mail printed to the console is printed to the service's log: invite and password-reset
    links among it, with which whoever reads the log gets in."""
    if settings.DEBUG or not settings.EMAIL_BACKEND.endswith(".console.EmailBackend"):
        return []
    return [Warning("E-mail goes to the console, so invite and password-reset links are written to the log.",
                    hint="Set EMAIL_URL (smtp://…, docs/configuration.md), or dummy:// to send none.",
                    id="chat.W002")]  # fmt: skip
