"""Shared fixtures: the fake upstream on a real socket, providers, users, websocket clients."""

from __future__ import annotations

import asyncio
import fcntl
import os
from dataclasses import dataclass

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.core.management import call_command
from django.test import Client

from chat.streaming import generation, upstream
from fakeupstream.app import FakeUpstream
from tests.fakeserver import FakeServer
from tests.live import LiveServer, database_url

FAKE_KEY = "sk-fake-upstream-key-0123456789"
DIALECTS = ["i14", "api14", "infyrence"]
# The model each dialect's provider is asked for in the tests.
MODELS = {
    "i14": "i14-sugarglider-nemotron3-super-120B-v1",
    "api14": "openai/gpt-5-mini",
    "infyrence": "claude-sonnet-5",
}


# --- markers and parallel workers (pytest-xdist) -----------------------------------------

# A test that uses one of these drives Chromium (conftest's browser fixture and those built on it).
BROWSER_FIXTURES = frozenset({"browser", "new_page", "page"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Mark the browser tests (before `-m` selects by marks)."""
    for item in items:
        if BROWSER_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.browser)


# A rough cost of a test, by its marks, for the order below.
WEIGHTS = {"slow": 30, "cluster": 15, "browser": 5}


class HeaviestFirst:
    """The heaviest test files first: `--dist loadfile --no-loadscope-reorder` hands the files out to the
    workers in this order, and a long file started last would keep one worker busy after the others.

    By file, so that the servers and browsers a module's fixtures start are started once."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        """A stable sort, after pytest's own reordering: a file's tests keep their order among themselves
        (which sets parametrized module fixtures up once per parameter)."""
        weights: dict[str, int] = {}
        for item in items:
            weight = max((WEIGHTS[mark.name] for mark in item.iter_markers() if mark.name in WEIGHTS), default=1)
            weights[item.location[0]] = weights.get(item.location[0], 0) + weight
        first = {file: index for index, file in reversed(list(enumerate(item.location[0] for item in items)))}
        items.sort(key=lambda item: (-weights[item.location[0]], first[item.location[0]]))


def pytest_configure(config):
    config.pluginmanager.register(HeaviestFirst(), "heaviest-first")
    import tests.services  # noqa: F401  (names the run, CHAT_TEST_RUN, before pytest-xdist starts its workers)


def pytest_sessionfinish(session):
    """The run's migrated templates (tests/services.py) are removed by the process that started the run."""
    if not hasattr(session.config, "workerinput"):
        from tests.services import drop_templates

        drop_templates()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    """A file, not memory, for the SQLite test database: a server subprocess must share it.

    One per xdist worker (each worker's tmp_path_factory is its own); another database
    engine gets pytest-django's per-worker suffix (test_chat_gw0, ...).
    """
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        database.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("db") / "test.sqlite3")


@pytest.fixture(scope="session", autouse=True)
def static_files(tmp_path_factory):
    """Hashed static files, as production serves them (DEBUG is off in tests too).

    Collected once a run: the xdist workers share STATIC_ROOT, and a collectstatic rewriting the
    manifest while another worker's server reads it would leave that server without it.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        call_command("collectstatic", interactive=False, verbosity=0)
        return
    run = tmp_path_factory.getbasetemp().parent  # shared by this run's workers
    with open(run / "static-files.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run / "static-files.done").exists():
            call_command("collectstatic", interactive=False, verbosity=0)
            (run / "static-files.done").touch()


@pytest.fixture(autouse=True)
def nothing_kept():
    """What this process keeps of the access rules and providers (chat/runtime/kept_reads.py) is not a test's
    before it: another test's rolled-back rows may have had the same ids."""
    from chat.runtime import kept_reads

    kept_reads.forget()


@pytest.fixture(autouse=True)
def no_titles(settings):
    """Model-written titles (chat/actions/titles.py) are one more upstream request and usage row after a first
    answer, which most tests do not expect: off, unless a test turns them on (tests/actions/test_titles.py)."""
    settings.CHAT_TITLES = False


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker):
    """The real server (daphne, in a subprocess) on the test database, for the whole session."""
    from django.db import connection

    with LiveServer({"DATABASE_URL": database_url(connection.settings_dict)}) as live:
        yield live


@dataclass
class Fake:
    app: FakeUpstream
    url: str

    def base_url(self, dialect: str) -> str:
        return f"{self.url}/{dialect}/v1"


@pytest.fixture(scope="session")
def fake_server():
    app = FakeUpstream(api_key=FAKE_KEY)
    with FakeServer(app) as server:
        yield Fake(app, server.url)


@pytest.fixture
def fake(fake_server):
    """The fake upstream, its records cleared."""
    fake_server.app.reset()
    return fake_server


@pytest.fixture
def providers(fake, transactional_db):
    """One provider per dialect, all pointing at the fake upstream; i14 lists its model itself."""
    from chat.models import Provider

    return {
        dialect: Provider.objects.create(
            name=dialect,
            base_url=fake.base_url(dialect),
            api_key=FAKE_KEY,
            default_model=MODELS[dialect] if dialect == "i14" else "",
        )
        for dialect in DIALECTS
    }


@pytest.fixture
def alice(django_user_model, transactional_db):
    return django_user_model.objects.create_user("alice", password="alice-secret-pw")


@pytest.fixture
def bob(django_user_model, transactional_db):
    return django_user_model.objects.create_user("bob", password="bob-secret-pw")


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


class Socket:
    """A websocket client on the real consumer stack (origin check, session auth, routing)."""

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        self.communicator = communicator

    async def send(self, **frame) -> None:
        await self.communicator.send_json_to(frame)

    async def receive(self, timeout: float = 10) -> dict:
        return await self.communicator.receive_json_from(timeout)

    async def until(self, frame_type: str, timeout: float = 15) -> list[dict]:
        """Every frame up to and including the first of `frame_type`."""
        frames: list[dict] = []
        async with asyncio.timeout(timeout):
            while not frames or frames[-1]["type"] != frame_type:
                frames.append(await self.receive(timeout))
        return frames

    async def nothing_more(self) -> bool:
        return await self.communicator.receive_nothing(timeout=0.2)


@pytest_asyncio.fixture
async def connect():
    """connect(user, origin=...) -> (accepted, close code, Socket); cleans up generations after."""
    from chat.ws.routing import websocket_application

    opened: list[WebsocketCommunicator] = []

    async def open_socket(user=None, origin: bytes = b"http://127.0.0.1:8000"):
        headers = [(b"origin", origin), (b"host", b"127.0.0.1:8000")]
        if user is not None:
            cookie = await sync_to_async(session_cookie)(user)
            headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
        communicator = WebsocketCommunicator(websocket_application, "/ws/chat/", headers=headers)
        accepted, code = await communicator.connect()
        opened.append(communicator)
        return accepted, code, Socket(communicator)

    yield open_socket
    for communicator in opened:
        await communicator.disconnect()
    async with asyncio.timeout(10):
        await generation.wait_all()
    await upstream.close_shared_client()
    await get_channel_layer().flush()


# --- the browser (the page's tests) ------------------------------------------------------


@pytest.fixture(scope="module")
def browser(server):
    """One Chromium for all the page tests (the system one: nothing is ever downloaded).

    Module-scoped, not session-scoped: Playwright's sync API keeps an event loop marked as
    running in this thread, which would break the asyncio tests of the modules that follow.
    For the same reason Django's ORM, called by fixtures here, must be told it is safe; the
    server was started before, so its process does not inherit that.
    """
    from tests.page_helpers import chromium

    with chromium() as browser:
        yield browser


@pytest.fixture
def new_page(browser, server, transactional_db):
    """new_page(user=None, url=server.url, **context options): a fresh context; page errors fail the test.

    After transactional_db, so torn down before it: the pages close before the database is emptied. A page
    still reading when it was emptied got 401s (its session gone) and failed the test that had passed.
    """
    from tests import page_helpers

    contexts = []
    errors: list[str] = []

    def make(user=None, url=None, **options):
        context = browser.new_context(base_url=url or server.url, **options)
        contexts.append(context)
        if user is not None:
            page_helpers.sign_in(context, user, url or server.url)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        return page

    yield make
    for context in contexts:
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture
def page(new_page, alice, providers):
    """Alice, signed in, on an empty chat page (the default model: i14, which reasons first)."""
    from tests import page_helpers

    page = new_page(alice)
    page_helpers.open_chat(page)
    return page
