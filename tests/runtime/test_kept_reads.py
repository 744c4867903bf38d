"""What a process keeps of who may use which model and of the enabled providers (chat/runtime/kept_reads.py):
read once, then none; a change made in the process is seen by the next start at once.

The change made in another process, told through Redis, is in tests/cluster/test_scaleout.py.
"""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from chat.models import ChatDefaults, GroupDefaults, ModelAccess, Provider
from chat.models.base import Read
from chat.runtime import kept_reads
from tests.services import check_on_postgresql

pytestmark = pytest.mark.django_db


@pytest.fixture
def dora():
    return get_user_model().objects.create_user("dora")


@pytest.fixture
def provider():
    return Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")


def access(user):
    """What the next start would find, and how many statements it sent for it."""
    with CaptureQueriesContext(connection) as sent:
        kept = kept_reads.start_inputs(user)
    return kept.access, [p.name for p in kept.providers], len(sent)


def test_a_start_reads_access_and_providers_once_then_keeps_them(dora, provider):
    assert access(dora)[1:] == (["p"], 3)  # the rules, her groups, the providers (one round trip on PostgreSQL)
    assert access(dora)[1:] == (["p"], 0)
    # Another person's groups are theirs: read for them, the rules and providers still kept.
    other = get_user_model().objects.create_user("eve")
    kept_reads.forget()
    access(dora)
    assert access(other)[2] == 1


def test_every_change_of_access_made_here_is_seen_by_the_next_start(dora, provider, settings):
    settings.ACCESS_CACHE_SECONDS = 3600  # only a change can make the next start read again
    assert access(dora)[0].allows(provider.pk, "m")

    rule = ModelAccess.objects.create(provider=provider, model="m")
    research = Group.objects.create(name="research")
    rule.groups.add(research)
    assert not access(dora)[0].allows(provider.pk, "m")

    dora.groups.add(research)
    assert access(dora)[0].allows(provider.pk, "m")
    dora.groups.add(research)  # nothing new, as a sign-in that sets the same groups again
    assert access(dora)[2] == 0

    GroupDefaults.objects.create(group=research, system_prompt="be brief")
    assert access(dora)[0].system_prompt == "be brief"

    research.user_set.remove(dora)  # from the group's side
    assert not access(dora)[0].allows(provider.pk, "m")

    rule.delete()
    assert access(dora)[0].allows(provider.pk, "m")

    kept_reads.start_inputs(dora, defaults=True)
    ChatDefaults.objects.create(user=dora, system_prompt="her own")  # her settings page
    assert access(dora)[2] == 0  # hers alone: what everyone else's starts read stays kept
    assert kept_reads.start_inputs(dora, defaults=True).defaults.system_prompt == "her own"
    ChatDefaults.objects.filter(user=dora).delete()
    assert kept_reads.start_inputs(dora, defaults=True).defaults.system_prompt == ""

    provider.enabled = False
    provider.save()
    assert access(dora)[1] == []
    Provider.objects.create(name="q", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert access(dora)[1] == ["q"]


def test_what_was_read_while_a_change_came_is_not_kept(dora, provider):
    """A read that began before a change may have read the old rows: the next start reads again."""
    kept_reads.forget()

    def changed_meanwhile(rows):
        kept_reads.forget()  # as a change committed by another thread between the read and its keeping
        return rows

    kept_reads.start_inputs(dora, [Read("SELECT 1", [], make=changed_meanwhile)])
    assert access(dora)[2] > 0
    assert access(dora)[2] == 0


def test_with_no_keeping_every_start_reads(dora, provider, settings):
    settings.ACCESS_CACHE_SECONDS = 0
    access(dora)
    assert access(dora)[2] > 0


def check_a_read_before_the_commit_of_a_change_is_not_kept():
    """Another thread that reads between a change's save and its commit sees the rows as they were: what it
    keeps is forgotten again at the commit. (PostgreSQL: SQLite's test database would lock that thread out.)"""
    user = get_user_model().objects.create_user("dora")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    seen = []

    def another_start():
        seen.append(kept_reads.start_inputs(user).access.allows(provider.pk, "m"))
        connection.close()

    with transaction.atomic():
        ModelAccess.objects.create(provider=provider, model="m")  # a limit with no group: no one may use it
        reading = threading.Thread(target=another_start)
        reading.start()
        reading.join()
    assert seen == [True]  # the rows as they were, kept by that thread
    assert not kept_reads.start_inputs(user).access.allows(provider.pk, "m")


def test_on_postgresql_a_read_before_the_commit_of_a_change_is_not_kept():
    check = "check_a_read_before_the_commit_of_a_change_is_not_kept"
    check_on_postgresql("chat_kept", "tests.runtime.test_kept_reads", check)
