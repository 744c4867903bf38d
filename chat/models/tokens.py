"""Personal API tokens for /v1/: shown once, stored as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import logging
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

log = logging.getLogger(__name__)


# --- personal API tokens -----------------------------------------------------

TOKEN_PREFIX = "sk-chat-"


class ApiTokenQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked__isnull=True, user__is_active=True)

    def for_secret(self, secret: str) -> ApiToken | None:
        """The active token with this secret; only its hash is stored."""
        return self.active().select_related("user").filter(digest=ApiToken.digest_of(secret)).first()


class ApiToken(models.Model):
    """A personal bearer token for /v1/; shown once, stored as a SHA-256 hash."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The first characters, to tell tokens apart.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def digest_of(secret: str) -> str:
        # The secret is 256 random bits: a fast hash is enough, unlike for passwords.
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def issue(cls, user, name: str) -> tuple[ApiToken, str]:
        """A new token and its secret, which is not kept anywhere."""
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=secret[:12], digest=cls.digest_of(secret))
        return token, secret

    def revoke(self) -> None:
        if self.revoked is None:
            self.revoked = timezone.now()
            self.save(update_fields=["revoked"])
