"""Reads of what admins and people set and every stream start needs (who may use which model, the enabled
providers, a person's defaults for a new chat), kept by each process for ACCESS_CACHE_SECONDS.

Each of those reads is a statement on every start, and on PostgreSQL every statement costs the server's
and the database's CPU in a burst. A change made in this process drops every kept read at once (the
signals below); one made in another serving process is told to this one through the control channel
(with REDIS_URL), and one that cannot be told (Redis away, a management command without REDIS_URL)
is seen within ACCESS_CACHE_SECONDS, as a revoked API token is (chat/auth/api_tokens.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from chat.models import ChatDefaults, GroupDefaults, ModelAccess, Provider
from chat.models.access import Access, access_from, access_reads
from chat.models.base import Read, read_together
from chat.runtime import control

# key -> (expiry on the monotonic clock, what its read made)
_kept: dict[Hashable, tuple[float, Any]] = {}
KEPT_MOST = 10_000  # a process that read more people's groups in a few seconds drops them all and reads again
# Bumped by every forget(): a read that began before a change does not keep what it read.
_generation = 0
_guard = threading.Lock()


def read_kept(kept: dict[Hashable, Read], more: list[Read] = ()) -> tuple[dict[Hashable, Any], list]:
    """What each of `kept` makes (this process's current copy, else read now) and what `more` make.

    The ones read now and `more` are read together, in one round trip (read_together); with every
    kept one current and no `more`, nothing is sent.
    """
    now, generation = time.monotonic(), _generation
    found: dict[Hashable, Any] = {}
    missing: dict[Hashable, Read] = {}
    for key, read in kept.items():
        entry = _kept.get(key)
        if entry is not None and entry[0] > now:
            found[key] = entry[1]
        else:
            missing[key] = read
    reads = [*missing.values(), *more]
    made = read_together(reads) if reads else []
    found.update(zip(missing, made, strict=False))
    seconds = settings.ACCESS_CACHE_SECONDS
    if missing and seconds > 0:
        with _guard:
            if generation == _generation:  # else a change came while reading: what was read may be older
                if len(_kept) + len(missing) > KEPT_MOST:
                    _kept.clear()
                for key in missing:
                    _kept[key] = (now + seconds, found[key])
    return found, made[len(missing) :]


def forget(person: int | None = None) -> None:
    """Drop every kept read of this process, or only one person's own chat defaults (a change here, or one told
    by another process)."""
    global _generation
    with _guard:
        _generation += 1
        if person is None:
            _kept.clear()
        else:
            _kept.pop(("defaults", person), None)


def _changed(sender, **kwargs) -> None:
    """One of the kept tables changed: forgotten here now, and by the other processes once it is committed."""
    if kwargs.get("action", "post_").startswith("pre_"):
        return  # a membership's change is sent twice, before and after: the second does it
    if kwargs.get("pk_set") == set():
        return  # add() or remove() of nothing new, as a sign-in that sets the same groups again sends
    # A person's own defaults (their settings page) are theirs alone: the rest stays kept for everyone.
    person = kwargs["instance"].user_id if sender is ChatDefaults else None
    forget(person)
    # Again once committed: another thread may have read the rows as they were, after the first forget()
    # and before the commit, and kept them. Then the other processes are told.
    transaction.on_commit(lambda: _committed(person), robust=True)


def _committed(person: int | None) -> None:
    forget(person)
    if settings.REDIS_URL:
        control.tell_tables_changed(person)


def connect_signals() -> None:
    """Forget on every change of a kept table (ChatConfig.ready()); QuerySet.update() sends none, and is
    not used on these tables outside a process's start-up, before it serves."""
    for model in (ModelAccess, GroupDefaults, Provider, Group, ChatDefaults):
        post_save.connect(_changed, sender=model, dispatch_uid=f"kept-{model.__name__}-saved")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"kept-{model.__name__}-deleted")
    for through in (ModelAccess.groups.through, get_user_model().groups.through):
        m2m_changed.connect(_changed, sender=through, dispatch_uid=f"kept-{through.__name__}-changed")


class StartInputs(NamedTuple):
    access: Access  # what the person may use
    providers: list[Provider]  # the enabled ones
    defaults: ChatDefaults | None  # the person's own defaults for a new chat, when asked for
    made: list  # what the other reads made


def start_inputs(user, more: list[Read] = (), *, defaults: bool = False) -> StartInputs:
    """What a stream's start reads before it resolves its model, kept (what `user` may use, the enabled providers,
    with `defaults` the person's own defaults), and what `more` make: in at most one round trip."""
    rules, groups = access_reads(user)
    kept = {"rules": rules, ("groups", user.pk): groups, "providers": Provider.objects.enabled_read()}
    if defaults:
        kept[("defaults", user.pk)] = ChatDefaults.read_of(user)
    found, made = read_kept(kept, more)
    access = access_from(user, found["rules"], found[("groups", user.pk)])
    return StartInputs(access, found["providers"], found.get(("defaults", user.pk)), made)
