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
from chat.streaming.catalog import CatalogEntry, catalog_of
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


def test_a_start_reads_access_and_providers_once_then_keeps_them(dora, provider, settings):
    settings.ACCESS_CACHE_SECONDS = 3600  # kept however slowly a busy host runs the test
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
    dora.groups.add(research)  # nothing new, as setting someone's groups to what they were sends
    assert access(dora)[2] == 0

    defaults = GroupDefaults.objects.create(group=research, system_prompt="be brief")
    assert access(dora)[0].system_prompt == "be brief"
    defaults.system_prompt = "be thorough"
    defaults.save()
    assert access(dora)[0].system_prompt == "be thorough"
    defaults.delete()
    assert access(dora)[0].system_prompt == ""

    research.user_set.remove(dora)  # from the group's side
    assert not access(dora)[0].allows(provider.pk, "m")
    research.user_set.set([dora])
    assert access(dora)[0].allows(provider.pk, "m")
    dora.groups.clear()
    assert not access(dora)[0].allows(provider.pk, "m")
    dora.groups.add(research)
    assert access(dora)[0].allows(provider.pk, "m")
    rule.groups.clear()  # the rule's side: now for no one
    assert not access(dora)[0].allows(provider.pk, "m")
    rule.groups.set([research])
    assert access(dora)[0].allows(provider.pk, "m")
    research.delete()  # her group gone with its place on the rule
    assert not access(dora)[0].allows(provider.pk, "m")

    rule.delete()
    assert access(dora)[0].allows(provider.pk, "m")

    kept_reads.start_inputs(dora, defaults=True)
    ChatDefaults.objects.create(user=dora, system_prompt="her own")  # her settings page
    assert access(dora)[2] == 0  # hers alone: what everyone else's starts read stays kept
    assert kept_reads.start_inputs(dora, defaults=True).defaults.system_prompt == "her own"
    ChatDefaults.objects.filter(user=dora).delete()
    assert kept_reads.start_inputs(dora, defaults=True).defaults.system_prompt == ""

    provider.api_key = "rotated"
    provider.save()
    assert [p.api_key for p in kept_reads.start_inputs(dora).providers] == ["rotated"]
    provider.enabled = False
    provider.save()
    assert access(dora)[1] == []
    other = Provider.objects.create(name="q", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert access(dora)[1] == ["q"]
    other.delete()
    assert access(dora)[1] == []


def test_a_provider_changed_while_its_models_were_fetched_is_used_as_it_is_now(dora, provider):
    """A start whose model lists were fetched (with_catalog) resolves in them cut to the providers read again
    after the fetch: one disabled meanwhile is gone, one whose key changed is used with the new key."""
    other = Provider.objects.create(name="q", base_url="http://127.0.0.1:9/v1", api_key="old")
    fetched = [CatalogEntry(provider, "m"), CatalogEntry(other, "n")]  # as fetched with the providers as they were
    provider.enabled = False
    provider.save()
    other.api_key = "new"
    other.save()
    providers = kept_reads.start_inputs(dora).providers
    catalog = catalog_of(providers, fetched)
    assert [(entry.provider.name, entry.model, entry.provider.api_key) for entry in catalog] == [("q", "n", "new")]


def test_what_was_read_while_a_change_came_is_not_kept(dora, provider, settings):
    """A read that began before a change may have read the old rows: the next start reads again."""
    settings.ACCESS_CACHE_SECONDS = 3600
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
