"""One person's largest import does not freeze the server for the others, on SQLite and on PostgreSQL.

Before, the import was one transaction (on SQLite the write lock held for half a minute and more): another
person's send got `server_busy` and `/v1` a 503 until it ended. The figures are bench/import_bench.py's.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests import heavy_requests
from tests.conftest import FAKE_KEY, MODELS
from tests.live import LiveServer, wait_until
from tests.services import postgres_database
from tests.sites import make_site

pytestmark = pytest.mark.slow

MODEL = MODELS["infyrence"]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_during_a_maximal_import_another_persons_send_and_v1_stream_start(fake_server, tmp_path, engine):
    database = postgres_database("chat_import_load", migrated=True) if engine == "postgresql" else None
    with database or contextlib.nullcontext("") as url:
        site = make_site(str(tmp_path / "chat.sqlite3"), fake_server.base_url("infyrence"), FAKE_KEY, url)
        importer = heavy_requests.add_person(site.database_url, "dave")
        with LiveServer({"DATABASE_URL": site.database_url, "LOG_LEVEL": "INFO"}) as live:  # its progress logged
            from django.conf import settings

            body = heavy_requests.chain_file(settings.CHAT_IMPORT_MAX_MESSAGES)  # the most one import may hold

            async def run():
                # Once before: the model list is fetched and cached, as on a server that has been serving.
                await heavy_requests.first_ws_delta(live.url, site.session, MODEL)
                return await heavy_requests.during_import(live, importer, body, [
                    lambda: heavy_requests.first_ws_delta(live.url, site.session, MODEL),
                    lambda: heavy_requests.first_v1_chunk(live.url, site.secret, MODEL),
                ])  # fmt: skip

            (ws, v1), still_running, response = asyncio.run(run())
            # Both got their first delta (not server_busy, not a 503) while the import went on.
            assert still_running, f"the import ended before the others were served ({ws:.2f} s, {v1:.2f} s)"
            assert response.status_code == 201, response.text
            assert "messages stored" in live.output()


def test_an_import_over_the_message_limit_is_a_413_that_says_the_limit(fake_server, tmp_path):
    site = make_site(str(tmp_path / "chat.sqlite3"), fake_server.base_url("infyrence"), FAKE_KEY)
    with LiveServer({"DATABASE_URL": site.database_url, "CHAT_IMPORT_MAX_MESSAGES": "100"}) as live:
        response = asyncio.run(heavy_requests.post_import(live.url, site.session, heavy_requests.chain_file(101)))
        assert response.status_code == 413, response.text
        assert response.json()["error"] == {
            "code": "too_large",
            "detail": "The file holds 101 messages; this server imports at most 100 at once.",
        }
        at_the_limit = heavy_requests.chain_file(100)
        assert asyncio.run(heavy_requests.post_import(live.url, site.session, at_the_limit)).status_code == 201
    assert site.count("chat_conversation") == 1 and site.count("chat_message") == 100


def test_an_import_whose_client_leaves_half_way_leaves_nothing(fake_server, tmp_path):
    site = make_site(str(tmp_path / "chat.sqlite3"), fake_server.base_url("infyrence"), FAKE_KEY)
    importer = heavy_requests.add_person(site.database_url, "dave")
    env = {"DATABASE_URL": site.database_url, "LOG_LEVEL": "INFO", "CHAT_BATCH_ROWS": "100"}
    with LiveServer(env) as live:
        body = heavy_requests.chain_file(5000)

        async def leave_half_way() -> None:
            importing = asyncio.ensure_future(heavy_requests.post_import(live.url, importer, body))
            assert await asyncio.to_thread(wait_until, lambda: heavy_requests.IMPORT_RUNNING in live.output())
            assert not importing.done()
            importing.cancel()  # the connection closes: the server's view is cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await importing

        asyncio.run(leave_half_way())
        assert wait_until(lambda: site.count("chat_conversation") == 0 and site.count("chat_message") == 0, 120), (
            site.count("chat_message"),
            live.output()[-2000:],
        )
