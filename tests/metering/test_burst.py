"""Many starts at once (chat/metering/metered_streams.py): budgets hold, the summaries stay exact, on PostgreSQL too.

Each start and each settle runs on a thread of its own with its own connection, all released
together, as the database threads of several processes would run them.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.test import override_settings

from chat.actions import orphans
from chat.actions.turns import Turn, begin_turn, turn_inputs
from chat.metering import budgets, limits, metered_streams, summary_triggers
from chat.metering.budgets import Budget, Price
from chat.models import ApiToken, Conversation, Message, Provider, Usage, UsageDay
from chat.streaming.catalog import CatalogEntry
from tests.services import check_on_postgresql

PROMPT, MAX = 10, 90  # a start reserves 100 tokens


def together(calls: list) -> list:
    """Run the calls at once, each on a thread with its own connection; their results or exceptions, in order."""
    ready = threading.Barrier(len(calls))
    found: list = [None] * len(calls)

    def run(index: int) -> None:
        try:
            ready.wait()
            found[index] = calls[index]()
        except Exception as exc:  # handed back to the test, which says which it expected
            found[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


def check_a_burst() -> None:
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    Price.objects.create(provider=provider, model="m", prompt=Decimal("2"), completion=Decimal("8"))
    people = [get_user_model().objects.create_user(f"person{n}") for n in range(4)]
    tokens = {person.pk: ApiToken.issue(person, "t")[0] for person in people}
    # The first person's budget holds five starts' reservations; the others have none.
    Budget.objects.create(user=people[0], tokens=5 * (PROMPT + MAX))

    def start(person, source):
        token = tokens[person.pk] if source == Usage.Source.API else None
        return metered_streams.start(person, source=source, provider=provider, model="m", prompt_tokens=PROMPT,
                                     max_tokens=MAX, token=token, check_limits=False).pk  # fmt: skip

    sources = (Usage.Source.API, Usage.Source.CHAT)
    calls = [lambda p=person, s=sources[n % 2]: start(p, s) for person in people for n in range(10)]
    started = together(calls)
    refused = [found for found in started[:10] if isinstance(found, budgets.BudgetExceeded)]
    assert len(refused) == 5, started[:10]  # the budget's five starts, not one more: no race past the lock
    assert all(isinstance(found, int) for found in started[10:]), started[10:]
    ids = [found for found in started if isinstance(found, int)]
    assert summary_triggers.mismatches() == []

    # Their ends at once, with what each stream used.
    def settle(pk: int, n: int):
        fields = {"status": "complete", "prompt_tokens": PROMPT, "completion_tokens": n, "total_tokens": PROMPT + n}
        return metered_streams.settle(pk, fields)

    ended = together([lambda pk=pk, n=n: settle(pk, n) for n, pk in enumerate(ids)])
    assert all(isinstance(found, dict) for found in ended), ended
    assert summary_triggers.mismatches() == []
    days = UsageDay.objects.filter(model="m")
    assert sum(days.values_list("requests", flat=True)) == len(ids) == 35
    assert sum(days.values_list("completion_tokens", flat=True)) == sum(range(len(ids)))
    assert days.values("shard").distinct().count() > 1  # the starts wrote rows of their own, not one shared row
    spent = budgets.spent_by("user_id", people[0].pk, budgets.month_start(), budgets.timezone.now())
    assert spent.tokens == 5 * PROMPT + sum(n for n, pk in enumerate(ids) if pk in set(ids[:5]))


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_starts_keeps_budgets_and_summaries_exact_on_sqlite():
    assert connection.vendor == "sqlite"
    check_a_burst()


@pytest.mark.cluster
def test_a_burst_of_starts_keeps_budgets_and_summaries_exact_on_postgresql():
    check_on_postgresql("chat_burst", "tests.metering.test_burst", "check_a_burst")


def check_a_checkpoint_waits_holding_nothing() -> None:
    """The /v1 streams' checkpoint writes each row in a transaction of its own: waiting for one row's summary, it
    holds none of another's (a start's insert waiting for a person's summary that a checkpoint held, while the
    checkpoint waited for the shard that insert held, was a deadlock)."""
    written = writes_each_row_apart(lambda first, second: Usage.objects.checkpoint([(first, 5, 0), (second, 7, 0)]))
    assert written("completion_tokens") == (5, 0, 7)


def check_a_sweep_waits_holding_nothing() -> None:
    """The same for the sweep of dead processes' /v1 rows (a process that starts alone takes every other's as dead)."""
    written = writes_each_row_apart(lambda first, second: orphans.recover_orphans())
    assert written("status") == ("interrupted", "streaming", "interrupted")


def holding(sql: str, params: list, held: threading.Event, release: threading.Event) -> None:
    """Hold the rows `sql` locks (on a thread of its own, in a transaction) until `release`; `held` once had."""
    try:
        with transaction.atomic():
            connection.cursor().execute(sql, params)
            held.set()
            release.wait(60)
    finally:
        connections.close_all()


def holding_the_person(person, held: threading.Event, release: threading.Event) -> None:
    """Hold `person`'s row as a start holds it until `release`."""
    holding("SELECT 1 FROM auth_user WHERE id = %s FOR NO KEY UPDATE", [person.pk], held, release)


def lock_waits() -> int:
    """How many of this database's backends wait for a lock now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def queued() -> int:
    """How many starts of this process wait behind another of their person's (metered_streams._Together)."""
    return sum(len(queue) for queue in metered_streams._Together._queued.values())


def until(condition) -> None:
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)  # neither PostgreSQL nor the queue tells when a start or a write begins to wait
    assert condition()


def writes_each_row_apart(write):
    """Start two /v1 streams, hold the second one's summary by model, and `write(first, second)` on a thread.

    Gives a function of a column: its value on the first row while the write waits, on the second row then,
    and on the second row once the write is done.
    """
    person = get_user_model().objects.create_user("gail")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")

    def start(model: str) -> int:
        return metered_streams.start(person, source=Usage.Source.API, provider=provider, model=model,
                                     prompt_tokens=PROMPT, max_tokens=MAX, check_limits=False).pk  # fmt: skip

    first, second = start("m"), start("n")
    held, release = threading.Event(), threading.Event()

    def writing() -> None:
        try:
            write(first, second)
        finally:
            connections.close_all()

    the_second_rows_shard = ("SELECT 1 FROM chat_usageday WHERE model = 'n' FOR UPDATE", [], held, release)
    holder, writer = threading.Thread(target=holding, args=the_second_rows_shard), threading.Thread(target=writing)
    holder.start()
    try:
        assert held.wait(30)
        writer.start()
        until(lambda: lock_waits() >= 1)
        # The write waits on the second row; the first is written and committed, nothing of it held.
        waiting = {pk: Usage.objects.filter(pk=pk).values().get() for pk in (first, second)}
    finally:
        release.set()
        holder.join(60)
        writer.join(60)
    done = Usage.objects.filter(pk=second).values().get()
    assert summary_triggers.mismatches() == []
    return lambda column: (waiting[first][column], waiting[second][column], done[column])


@pytest.mark.parametrize("check", ["check_a_checkpoint_waits_holding_nothing", "check_a_sweep_waits_holding_nothing"])
def test_on_postgresql_a_write_of_many_usage_rows_holds_none_while_it_waits(check):
    check_on_postgresql("chat_rows_apart", "tests.metering.test_burst", check)


def made_behind_a_lock(person, start) -> tuple[object, list]:
    """Hold `person`'s row, let `start(0)` wait for it, queue `start(1)`..`start(4)` behind that one, release:
    what the first returned or raised, and what the later four did."""
    held, release = threading.Event(), threading.Event()
    found: dict[int, object] = {}

    def starting(n: int) -> None:
        try:
            found[n] = start(n)
        except Exception as exc:  # handed back to the test, which says which it expected
            found[n] = exc
        finally:
            connections.close_all()

    holder = threading.Thread(target=holding_the_person, args=(person, held, release))
    threads = [threading.Thread(target=starting, args=(n,)) for n in range(5)]
    holder.start()
    try:
        assert held.wait(30)
        threads[0].start()
        until(lambda: lock_waits() >= 1)  # the first start holds the lead, waiting for the person's row
        for thread in threads[1:]:
            thread.start()
        until(lambda: queued() == 4)
    finally:
        release.set()
        holder.join(60)
        for thread in threads:
            thread.join(60)
    return found[0], [found[n] for n in range(1, 5)]


def two_made_two_refused(later: list) -> list:
    """Of the four queued starts, behind a first, under a cap of 3 at once: the two made; the other two refused."""
    made = [result for result in later if not isinstance(result, Exception)]
    refused = [exc for exc in later if isinstance(exc, limits.LimitExceeded)]
    assert len(made) == 2 and len(refused) == 2 and {exc.code for exc in refused} == {"too_many_streams"}, later
    return made


def commits_of(table: str, column: str, person) -> dict[int, str]:
    """The person's rows of `table` (`column` names the person), each with the transaction that wrote it (xmin)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, xmin::text FROM {table} WHERE {column} = %s", [person.pk])
        return dict(cursor.fetchall())


def check_starts_queued_behind_a_lock_are_made_together() -> None:
    """A person's starts that arrive while one of theirs waits for the lock are made in one transaction after
    it, each admitted as if the ones before it were written: the cap on streams at once (3) still holds."""
    person = get_user_model().objects.create_user("hal")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    token, _ = ApiToken.issue(person, "t")
    first, later = made_behind_a_lock(person, lambda n: metered_streams.start(
        person, source=Usage.Source.API, provider=provider, model="m", prompt_tokens=PROMPT, max_tokens=MAX,
        token=token,
    ).pk)  # fmt: skip
    assert isinstance(first, int), first
    made = two_made_two_refused(later)
    transactions = commits_of("chat_usage", "user_id", person)
    assert sorted(transactions) == sorted([first, *made])
    assert transactions[made[0]] == transactions[made[1]] != transactions[first]  # the later two: one commit
    assert summary_triggers.mismatches() == []


@override_settings(CHAT_MAX_STREAMS=3)
def check_new_chats_queued_behind_a_lock_are_made_together() -> None:
    """A person's new chats started at once are made as their /v1 starts are: the ones queued behind a first in
    one transaction, each conversation with its messages; a refused one stores nothing."""
    person = get_user_model().objects.create_user("ida")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")

    def new_chat(n: int) -> Turn:
        ids = turn_inputs(person, None)[4]
        assert ids is not None
        return begin_turn(person, CatalogEntry(provider, "m"), {}, content=f"hello {n}", ids=ids)

    first, later = made_behind_a_lock(person, new_chat)
    assert isinstance(first, Turn), first
    made = two_made_two_refused(later)
    conversations = commits_of("chat_conversation", "owner_id", person)
    assert sorted(conversations) == sorted(turn.conversation.pk for turn in [first, *made])  # none of the refused
    assert conversations[made[0].conversation.pk] == conversations[made[1].conversation.pk]  # one commit
    assert conversations[made[0].conversation.pk] != conversations[first.conversation.pk]
    for turn in [first, *made]:
        stored = Conversation.objects.get(pk=turn.conversation.pk)
        messages = list(stored.messages.order_by("pk").values_list("pk", "parent_id", "status"))
        assert stored.current_id == turn.reply.pk
        assert messages == [
            (turn.user_message.pk, None, "complete"),
            (turn.reply.pk, turn.user_message.pk, "streaming"),
        ]
        assert Usage.objects.get(message_id=turn.reply.pk).status == "streaming"
    assert Message.objects.filter(conversation__owner=person).count() == 6
    assert summary_triggers.mismatches() == []


def test_on_postgresql_new_chats_queued_behind_a_lock_are_made_together():
    check_on_postgresql(
        "chat_together_turns", "tests.metering.test_burst", "check_new_chats_queued_behind_a_lock_are_made_together"
    )


@override_settings(API_MAX_STREAMS=3)
def check_starts_together_three_at_most() -> None:
    check_starts_queued_behind_a_lock_are_made_together()


def test_on_postgresql_starts_queued_behind_a_lock_are_made_together():
    check_on_postgresql("chat_together", "tests.metering.test_burst", "check_starts_together_three_at_most")


def check_a_start_in_the_callers_transaction_is_made_in_it() -> None:
    """A start inside the caller's atomic block is not made in another thread's transaction, even while others
    of the person's are queued: the caller's rollback takes its row away, and only its row."""
    person = get_user_model().objects.create_user("ida")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    held, release = threading.Event(), threading.Event()
    found: list = []

    def start() -> int:
        return metered_streams.start(person, source=Usage.Source.API, provider=provider, model="m",
                                     prompt_tokens=PROMPT, max_tokens=MAX).pk  # fmt: skip

    def elsewhere() -> None:
        try:
            found.append(start())
        finally:
            connections.close_all()

    def releaser() -> None:
        # Once the caller's start waits too: for the row (made in its own transaction) or in the queue.
        try:
            until(lambda: lock_waits() >= 2 or queued() >= 2)
        finally:
            release.set()
            connections.close_all()

    holder = threading.Thread(target=holding_the_person, args=(person, held, release))
    others = [threading.Thread(target=elsewhere) for _ in range(2)]
    holder.start()
    assert held.wait(30)
    others[0].start()
    until(lambda: lock_waits() >= 1)  # the first leads, waiting for the person's row
    others[1].start()
    until(lambda: queued() >= 1)  # the second is queued behind it
    threading.Thread(target=releaser).start()
    try:
        with transaction.atomic():
            mine = start()
            raise RuntimeError("the caller's transaction fails")
    except RuntimeError:
        pass
    holder.join(60)
    for thread in others:
        thread.join(60)
    assert len(found) == 2 and Usage.objects.filter(pk__in=found).count() == 2, found
    assert not Usage.objects.filter(pk=mine).exists()


def test_on_postgresql_a_start_in_the_callers_transaction_is_made_in_it():
    check_on_postgresql(
        "chat_in_atomic", "tests.metering.test_burst", "check_a_start_in_the_callers_transaction_is_made_in_it"
    )
