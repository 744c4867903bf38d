"""Sockets follow their session: sign-out, a password change or deactivation closes them (code 4401).

A deactivation also deletes the user's sessions and stops their running streams on every
process (sign_out_everywhere); `manage.py deactivate USERNAME` does the same as the admin.

Each socket joins its user's channel-layer group. On any of those triggers the
group is told to re-check; each socket then re-validates its own session the way
an HTTP request would (the session exists, its auth hash matches, the user is
active), so only the sessions that really ended are closed, on every process.
"""

from __future__ import annotations

import logging
from collections import Counter
from importlib import import_module
from types import SimpleNamespace

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user, get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.utils import timezone

from chat.actions.streams import end_local_token, end_local_user
from chat.lib.channel_groups import user_group
from chat.models import ApiToken
from chat.runtime import control, process_loops
from chat.runtime.failures import every
from chat.streaming import relay
from chat.streaming.generation import running_users

log = logging.getLogger(__name__)

CHECK_EVENT = "session.check"
# A password or is_active written in these fields can end sessions.
AUTH_FIELDS = frozenset({"password", "is_active"})


# How many sockets each signed-in user has open on this process (watch_accounts_forever watches them).
_sockets: Counter[int] = Counter()


def socket_opened(user_id: int) -> None:
    _sockets[user_id] += 1


def socket_closed(user_id: int) -> None:
    _sockets[user_id] -= 1
    if _sockets[user_id] <= 0:
        del _sockets[user_id]


def open_sockets(user_id: int) -> int:
    """How many sockets the user has open on this process."""
    return _sockets[user_id]


def connected_users() -> set[int]:
    """The users with a socket open on this process."""
    return set(_sockets)


def session_is_valid(session_key: str | None, user_id: int) -> bool:
    """Whether this session still signs in this user, checked as an HTTP request would be."""
    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    # get_user() loads the session, checks the auth hash and that the user may still sign in.
    user = get_user(SimpleNamespace(session=store))
    return user.is_authenticated and user.pk == user_id


def notify_user(user_id: int, ended_session: str | None = None) -> None:
    """Ask every socket of this user, on every process, to re-check its session (after the commit)."""
    event = {"type": CHECK_EVENT, "ended": ended_session}

    def send() -> None:
        try:
            async_to_sync(get_channel_layer().group_send)(user_group(user_id), event)
        except Exception as exc:  # the change itself must not fail; sockets re-check on their next frame anyway
            log.warning("could not tell user %s's sockets to re-check their session: %r", user_id, exc)

    transaction.on_commit(send)


def on_logged_out(sender, request, user, **kwargs) -> None:
    if user is None or user.pk is None:
        return
    ended = getattr(getattr(request, "session", None), "session_key", None)
    if ended:
        # Django flushes the session only after this signal. A tab that the 4401 sends to the
        # sign-in page must not find it still signed in (and be bounced back to the chat); the
        # request's own session object is left to that flush and to the other receivers.
        import_module(settings.SESSION_ENGINE).SessionStore(ended).delete()
    notify_user(user.pk, ended)


def remember_auth_fields(sender, instance, update_fields=None, **kwargs) -> None:
    """Before a user is saved: note whether its password or is_active is about to change."""
    instance._auth_changed = instance._deactivated = False
    if instance.pk is None or (update_fields is not None and not AUTH_FIELDS & set(update_fields)):
        return
    before = sender._default_manager.filter(pk=instance.pk).values("password", "is_active").first()
    if before is not None:
        instance._deactivated = before["is_active"] and not instance.is_active
        instance._auth_changed = before["password"] != instance.password or instance._deactivated


def on_user_saved(sender, instance, created, **kwargs) -> None:
    if getattr(instance, "_deactivated", False):
        instance._deactivated = False
        user_id = instance.pk
        transaction.on_commit(lambda: sign_out_everywhere(user_id))
    if getattr(instance, "_auth_changed", False):
        instance._auth_changed = False
        notify_user(instance.pk)


def sign_out_everywhere(user_id: int) -> int:
    """After a deactivation: delete the user's sessions and stop their running streams on every process.

    Their sockets are closed by notify_user (they re-check a session that is gone); their
    API tokens are refused by ApiToken.objects.for_secret (inactive users' tokens are not
    active). Conversations and usage stay. Returns how many sessions were deleted.
    """
    deleted = delete_sessions(user_id)
    control.end_user_streams(user_id)
    return deleted


def delete_sessions(user_id: int) -> int:
    """Delete every stored session signed in as this user; how many (0 for a store that cannot be searched)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if not hasattr(store, "get_model_class"):  # signed cookies, plain cache: the is_active check ends them
        return 0
    model = store.get_model_class()
    # Session data is encoded, so each current session is read: a deactivation is rare, sessions few.
    ended = [
        session.session_key
        for session in model.objects.filter(expire_date__gt=timezone.now()).iterator()
        if str(store().decode(session.session_data).get(SESSION_KEY)) == str(user_id)
    ]
    model.objects.filter(session_key__in=ended).delete()
    if hasattr(store, "cache_key_prefix"):  # cached_db keeps a copy in the cache too
        for key in ended:
            store(key).delete()
    return len(ended)


def on_user_deleted(sender, instance, **kwargs) -> None:
    notify_user(instance.pk)


def connect_signals() -> None:
    """Called once from ChatConfig.ready()."""
    user_model = get_user_model()
    user_logged_out.connect(on_logged_out, dispatch_uid="chat.auth.session_sockets.logged_out")
    pre_save.connect(remember_auth_fields, sender=user_model, dispatch_uid="chat.auth.session_sockets.pre_save")
    post_save.connect(on_user_saved, sender=user_model, dispatch_uid="chat.auth.session_sockets.post_save")
    post_delete.connect(on_user_deleted, sender=user_model, dispatch_uid="chat.auth.session_sockets.post_delete")


async def watch_accounts_forever(process: process_loops.Process) -> None:
    """Every CHAT_ACCOUNT_CHECK_SECONDS: sign out here the users with a socket or a stream on this process
    who were deactivated or deleted meanwhile, whatever did it.

    The admin tells every process at once (sign_out_everywhere); this catches the rest: a
    `manage.py deactivate` from another process without Redis, a bulk UPDATE. One query
    a second, and only while someone is connected; a database error is logged and retried.
    """
    await every(
        lambda failures: settings.CHAT_ACCOUNT_CHECK_SECONDS,
        _sign_out_inactive,
        "cannot check whether connected accounts are still active",
        "checking connected accounts again",
    )


async def _sign_out_inactive() -> None:
    present = connected_users() | relay.running.owners() | running_users()
    if not present:
        return
    active = await database_sync_to_async(_active_users, thread_sensitive=False)(present)
    tokens = relay.running.tokens()
    if tokens:  # revoked elsewhere (another process without Redis, a bulk UPDATE): their /v1 streams end
        for token_id in await database_sync_to_async(_revoked_tokens, thread_sensitive=False)(tokens):
            end_local_token(token_id)
    for user_id in present - active:
        end_local_user(user_id)
        event = {"type": CHECK_EVENT, "ended": None}  # each socket finds its session gone
        try:
            await get_channel_layer().group_send(user_group(user_id), event)
        except Exception as exc:  # their sockets re-check at their next frame anyway
            log.warning("could not tell user %s's sockets to re-check their session: %r", user_id, exc)


def _revoked_tokens(ids: set[int]) -> list[int]:
    return list(ApiToken.objects.filter(pk__in=ids, revoked__isnull=False).values_list("pk", flat=True))


def _active_users(ids: set[int]) -> set[int]:
    return set(get_user_model().objects.filter(pk__in=ids, is_active=True).values_list("pk", flat=True))
