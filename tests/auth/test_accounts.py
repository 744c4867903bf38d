"""Sign-in throttling (django-axes, chat/auth/signin.py) on the real server, and bounded password hashing."""

from __future__ import annotations

import asyncio
import os
import threading

import httpx
import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import authenticate
from django.contrib.auth.forms import AuthenticationForm
from django.db import connection
from django.test import RequestFactory

from chat.auth import signin
from tests.conftest import session_cookie
from tests.live import LiveServer, database_url

pytestmark = pytest.mark.django_db(transaction=True)
WRONG = "not-the-password"
LOCKED = "Too many failed sign-ins"


@pytest.fixture(scope="module")
def throttled(django_db_setup, django_db_blocker):
    """The server behind a trusted proxy (127.0.0.1), so each test picks the client addresses it needs."""
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "AUTH_LOCKOUT_FAILURES": "3",
        "DJANGO_TRUSTED_PROXIES": "127.0.0.1",
        "AUTH_HASH_CONCURRENCY": "2",
    }
    with LiveServer(env) as server:
        yield server


async def sign_in(url: str, username: str, password: str, address: str | None = None, path: str = "/accounts/login/"):
    """The sign-in form posted as a browser would (optionally through the proxy, from `address`)."""
    headers = {"X-Forwarded-For": address} if address else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as browser:
        await browser.get(path)
        form = {"username": username, "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        response = await browser.post(path, data=form)
        response.signed_in = settings.SESSION_COOKIE_NAME in response.cookies
        return response


async def test_ten_wrong_passwords_lock_the_account_and_the_address(server, alice, bob):
    for attempt in range(9):
        # A client that forges X-Forwarded-For gains nothing: no proxy is trusted by default.
        refused = await sign_in(server.url, "alice", WRONG, address=f"10.0.0.{attempt}")
        assert refused.status_code == 200 and "correct username and password" in refused.text
    tenth = await sign_in(server.url, "alice", WRONG, address="10.0.0.9")
    assert tenth.status_code == 429 and LOCKED in tenth.text
    locked = await sign_in(server.url, "alice", "alice-secret-pw")
    assert locked.status_code == 429 and not locked.signed_in
    assert LOCKED in locked.text and "wait 15 minutes" in locked.text
    assert '<form method="post"' in locked.text  # the sign-in page itself, not a bare error
    # The ten failures came from one address, which is locked for every account too.
    other = await sign_in(server.url, "bob", "bob-secret-pw", address="10.9.9.9")
    assert other.status_code == 429 and not other.signed_in


async def test_an_account_is_locked_whatever_the_address(throttled, alice, bob):
    for attempt in range(3):
        await sign_in(throttled.url, "alice", WRONG, address=f"198.51.100.{attempt}")
    locked = await sign_in(throttled.url, "alice", "alice-secret-pw", address="198.51.100.50")
    assert locked.status_code == 429 and LOCKED in locked.text and not locked.signed_in
    assert (await sign_in(throttled.url, "bob", "bob-secret-pw", address="198.51.100.51")).signed_in


async def test_an_address_is_locked_whatever_the_account(throttled, alice, bob):
    for name in ("carol", "dave", "erin"):
        await sign_in(throttled.url, name, WRONG, address="203.0.113.7")
    locked = await sign_in(throttled.url, "bob", "bob-secret-pw", address="203.0.113.7")
    assert locked.status_code == 429 and LOCKED in locked.text and not locked.signed_in
    assert (await sign_in(throttled.url, "bob", "bob-secret-pw", address="203.0.113.8")).signed_in


async def test_the_admin_sign_in_is_throttled_too_and_staff_unlock_in_the_admin(
    throttled, alice, admin_user, django_user_model
):
    for attempt in range(3):
        await sign_in(throttled.url, "alice", WRONG, address=f"192.0.2.{attempt}", path="/admin/login/")
    locked = await sign_in(throttled.url, "alice", "alice-secret-pw", address="192.0.2.50", path="/admin/login/")
    assert locked.status_code == 429 and LOCKED in locked.text and not locked.signed_in
    assert (await sign_in(throttled.url, "alice", "alice-secret-pw", address="192.0.2.51")).status_code == 429

    cookie = await sync_to_async(session_cookie)(admin_user)
    attempts = [pk async for pk in AccessAttempt.objects.filter(username="alice").values_list("pk", flat=True)]
    async with httpx.AsyncClient(base_url=throttled.url, cookies={"sessionid": cookie}) as staff:
        listing = await staff.get("/admin/axes/accessattempt/")
        assert listing.status_code == 200 and "alice" in listing.text
        form = {"action": "delete_selected", "_selected_action": attempts, "post": "yes"}
        form["csrfmiddlewaretoken"] = staff.cookies["csrftoken"]
        assert (await staff.post("/admin/axes/accessattempt/", data=form)).status_code == 302
    assert (await sign_in(throttled.url, "alice", "alice-secret-pw", address="192.0.2.52")).signed_in


def cpu_ticks_by_thread(pid: int) -> dict[int, int]:
    """CPU time (user + system, in clock ticks) of each thread of a process, from /proc."""
    ticks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


async def test_a_flood_of_wrong_passwords_is_hashed_on_at_most_the_bound_of_threads(throttled, alice):
    """Each wrong password costs ~0.3-0.5 s of a core. Before, each was hashed on its request's own
    thread, all at once: 16 of them took both cores from every other page for seconds."""
    cookie = await sync_to_async(session_cookie)(alice)
    attackers = []
    for i in range(16):  # each has loaded the form already (and a new address and account: none gets locked)
        attacker = httpx.AsyncClient(base_url=throttled.url, headers={"X-Forwarded-For": f"100.64.0.{i}"}, timeout=60)
        await attacker.get("/accounts/login/")
        attackers.append(attacker)
    forms = [
        {"username": f"nobody{i}", "password": WRONG, "csrfmiddlewaretoken": attacker.cookies["csrftoken"]}
        for i, attacker in enumerate(attackers)
    ]
    pid = throttled.process.pid
    first: dict[int, int] = {}
    last: dict[int, int] = {}

    def sample() -> None:
        for tid, ticks in cpu_ticks_by_thread(pid).items():
            first.setdefault(tid, ticks)
            last[tid] = ticks

    sample()
    logins = [asyncio.ensure_future(a.post("/accounts/login/", data=f)) for a, f in zip(attackers, forms, strict=True)]
    answered_meanwhile = 0  # pages answered while wrong passwords were still waiting to be hashed
    async with httpx.AsyncClient(base_url=throttled.url, cookies={"sessionid": cookie}, timeout=60) as browser:
        while not all(login.done() for login in logins):
            assert (await browser.get("/api/conversations")).status_code == 200
            answered_meanwhile += not all(login.done() for login in logins)
            sample()  # threads come and go with requests: note each one's CPU time while it lives
    sample()
    refused = await asyncio.gather(*logins)
    for attacker in attackers:
        await attacker.aclose()
    # Wrong, or (on a loaded machine) told to come back after AUTH_HASH_WAIT: never signed in, never an error page.
    assert not any(settings.SESSION_COOKIE_NAME in r.cookies for r in refused)
    assert all(r.status_code == 200 or (r.status_code == 503 and signin.BUSY in r.text) for r in refused)
    # Structural: the threads (other than the event loop's) that spent a hash's worth of CPU are the pool's.
    hashing = [tid for tid in last if tid != pid and last[tid] - first[tid] >= 0.2 * os.sysconf("SC_CLK_TCK")]
    assert 1 <= len(hashing) <= 2, f"{len(hashing)} threads hashed at once"
    # And pages kept being answered meanwhile, not only once the flood was hashed.
    assert answered_meanwhile >= 1


def test_no_more_than_the_bound_of_passwords_are_hashed_at_once(alice):
    signin.hash_stats.peak = 0
    request = RequestFactory().post("/accounts/login/")
    request.META["REMOTE_ADDR"] = "127.0.0.1"
    threads = [
        threading.Thread(target=authenticate, kwargs={"request": request, "username": f"u{i}", "password": WRONG})
        for i in range(3 * settings.AUTH_HASH_CONCURRENCY)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= signin.hash_stats.peak <= settings.AUTH_HASH_CONCURRENCY


def test_a_sign_in_that_cannot_get_a_turn_is_told_the_server_is_busy_and_not_counted(alice, settings, monkeypatch):
    settings.AUTH_HASH_WAIT = 0.05
    monkeypatch.setattr(signin, "_hash_slots", threading.BoundedSemaphore(1))
    signin._hash_slots.acquire()  # every slot taken by other sign-ins
    request = RequestFactory().post("/accounts/login/")
    request.META["REMOTE_ADDR"] = "127.0.0.1"
    form = AuthenticationForm(request, data={"username": "alice", "password": "alice-secret-pw"})
    assert not form.is_valid()
    assert form.non_field_errors() == [signin.BUSY]
    assert not AccessAttempt.objects.exists()  # busy is not a wrong password


async def test_one_logins_sign_ins_take_turns_leaving_the_pool_to_others():
    """Forty right passwords for one account at once took every turn: another person's sign-in got 503."""
    assert signin.login_key(" Dave ") == signin.login_key("DAVE") == signin.login_key("\uff24ave") == "dave"
    first, second = signin._logins.turn(signin.login_key("dave")), signin._logins.turn(signin.login_key("DAVE"))
    await first.__aenter__()
    waiting = asyncio.create_task(second.__aenter__())
    await asyncio.sleep(0)  # it runs up to its wait
    async with asyncio.timeout(10):
        async with signin._logins.turn(signin.login_key("pat")):  # someone else's is not behind dave's
            assert not waiting.done()
    await first.__aexit__(None, None, None)
    async with asyncio.timeout(10):
        await waiting
    await second.__aexit__(None, None, None)
    assert not signin._logins  # forgotten once no one holds or waits for it


def test_code_may_still_check_a_password_without_a_request(alice):
    # Management commands and tests call authenticate() with no request; there is no client to throttle.
    assert authenticate(username="alice", password="alice-secret-pw") == alice
    assert authenticate(username="alice", password=WRONG) is None
