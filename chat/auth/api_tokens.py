"""Who a `/v1` request is: its bearer token, from the database or a short in-process cache."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver
from django.utils import timezone

from chat.models import ApiToken
from chat.runtime import control, db_busy, db_threads, kept_reads

log = logging.getLogger(__name__)


def bearer(request) -> str | None:
    """The secret in `Authorization: Bearer …`; no other header or parameter is a credential."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


async def authenticate(request) -> ApiToken | None:
    """The active token of the request, read from the database."""
    secret = bearer(request)
    return None if secret is None else await db_threads.run(token_for)(secret)


def token_for(secret: str) -> ApiToken | None:
    """The active token with this secret, its use noted at most once a minute."""
    token = ApiToken.objects.for_secret(secret)
    if token is not None and (token.last_used is None or timezone.now() - token.last_used > timedelta(minutes=1)):
        touch_last_used(token)
    return token


# A completion's token, kept for API_TOKEN_CACHE_SECONDS: digest -> (token with its user, expiry).
_tokens: dict[str, tuple[ApiToken, float]] = {}
TOKEN_CACHE_SIZE = 10_000


def cached_token_for(secret: str) -> ApiToken | None:
    """token_for() from a short in-process cache: a stream start then costs no query for it.

    Revoking a token or deactivating its owner in this process drops it at once (forget_tokens);
    in another process it is noticed within API_TOKEN_CACHE_SECONDS.
    """
    digest, now = ApiToken.digest_of(secret), time.monotonic()
    cached = _tokens.get(digest)
    if cached is not None and cached[1] > now:
        return cached[0]
    token = token_for(secret)
    if token is None:
        _tokens.pop(digest, None)
    elif settings.API_TOKEN_CACHE_SECONDS > 0:
        if len(_tokens) >= TOKEN_CACHE_SIZE:
            _tokens.clear()  # many tokens in 5 s: simplest bound, they are read again
        _tokens[digest] = (token, now + settings.API_TOKEN_CACHE_SECONDS)
    return token


def forget_tokens(user_id: int | None = None, token_id: int | None = None) -> None:
    """Drop cached tokens of a user, or one token, so that a revocation takes effect at once."""
    for digest, (token, _) in list(_tokens.items()):
        if token.user_id == user_id or token.pk == token_id:
            _tokens.pop(digest, None)


@receiver(post_save, sender=ApiToken)
def _token_saved(sender, instance, update_fields=None, **kwargs) -> None:
    forget_tokens(token_id=instance.pk)
    if instance.revoked is not None and (update_fields is None or "revoked" in update_fields):
        # Its running /v1 streams end too, on every process (as a deactivation's do).
        token_id = instance.pk
        transaction.on_commit(lambda: control.end_token_streams(token_id))


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def _user_saved(sender, instance, **kwargs) -> None:
    forget_tokens(user_id=instance.pk)


def caller(secret: str) -> tuple | None:
    """The token, what its owner may use and the enabled providers, each kept a few seconds: (token, Access, providers).

    At most one round trip, none while all three are kept (chat/runtime/kept_reads.py).
    """
    token = cached_token_for(secret)
    if token is None:
        return None
    kept = kept_reads.start_inputs(token.user)
    return token, kept.access, kept.providers


def touch_last_used(token: ApiToken) -> None:
    """Note when a token was last used; skipped, not waited for, while the database is busy."""
    token.last_used = timezone.now()
    try:
        # Only a hint for its owner: not worth holding a request behind someone else's write.
        with db_busy.short_wait(0.1):
            ApiToken.objects.filter(pk=token.pk).update(last_used=token.last_used)
    except db_busy.UNAVAILABLE as exc:
        log.info("skipped noting that API token %s was used: %s", token.pk, exc)
