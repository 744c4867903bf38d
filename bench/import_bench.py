"""What one person's largest import costs everyone else: another person's starts while it runs, and the import's
conversation afterwards (opening it, exporting it, deleting it).

It starts the fake upstream and the server (one process, a fresh SQLite file; --database-url for
PostgreSQL), signs in two people, and prints, for carol while dave imports one chain of --messages
messages (default: CHAT_IMPORT_MAX_MESSAGES, the most one import may hold), the time from her websocket
`send` to its first delta, from her `/v1` request to its first chunk and her password sign-in, each
--rounds times before the import and as many times during it; then the import's own time, the
conversation page's first read (bytes, time), the Markdown export (first byte, whole) and the delete.

    .venv/bin/python bench/import_bench.py
    .venv/bin/python bench/import_bench.py --database-url postgres://postgres@127.0.0.1:5432/chat_bench
    .venv/bin/python bench/import_bench.py --server-root /path/to/another/checkout --settle 1

--server-root runs another checkout's server (an older one, for before/after figures); one that does not
log its import's progress is measured --settle seconds after the import was sent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402

from fakeupstream.app import FakeUpstream  # noqa: E402
from tests import heavy_requests, live  # noqa: E402
from tests.fakeserver import FakeServer  # noqa: E402
from tests.sites import make_site  # noqa: E402

KEY = "bench-upstream-key"
MODEL = "claude-sonnet-5"


async def timed(make) -> float | str:
    """Seconds, or what went wrong (server_busy, a 503, a timeout), bounded at 120 s."""
    try:
        async with asyncio.timeout(120):
            return await make()
    except TimeoutError:
        return "no answer in 120 s"
    except AssertionError as exc:
        return str(exc)[:80]


def shown(values: list) -> str:
    numbers = [v for v in values if isinstance(v, float)]
    failures = [v for v in values if not isinstance(v, float)]
    text = f"median {statistics.median(numbers):6.3f} s, most {max(numbers):6.3f} s" if numbers else "-"
    return text + (f"; {len(failures)} failed: {failures[0]}" if failures else "")


async def measure(args, server, site, importer: str) -> None:
    others = {
        "websocket send -> first delta": lambda: heavy_requests.first_ws_delta(server.url, site.session, MODEL),
        "/v1 request -> first chunk": lambda: heavy_requests.first_v1_chunk(server.url, site.secret, MODEL),
        "password sign-in": lambda: heavy_requests.sign_in(server.url, "carol"),
    }
    before = {name: [await timed(make) for _ in range(args.rounds)] for name, make in others.items()}
    body = heavy_requests.chain_file(args.messages)
    began = time.monotonic()
    importing = asyncio.ensure_future(heavy_requests.post_import(server.url, importer, body))
    while heavy_requests.IMPORT_RUNNING not in server.output() and not importing.done():
        if args.settle and time.monotonic() - began > args.settle:
            break
        await asyncio.sleep(0.02)
    during: dict[str, list] = {name: [] for name in others}
    served_during = 0
    for _ in range(args.rounds):
        results = await asyncio.gather(*(timed(make) for make in others.values()))
        served_during += not importing.done()
        for name, result in zip(others, results, strict=True):
            during[name].append(result)
    response = await importing
    took = time.monotonic() - began
    print(f"\nimport of {args.messages:,} messages in one chain ({len(body) / 1e6:.2f} MB): HTTP {response.status_code}"
          f" in {took:.1f} s; {served_during} of {args.rounds} rounds finished while it ran")  # fmt: skip
    print(f"{'':34} {'before the import':44} during it")
    for name in others:
        print(f"{name:34} {shown(before[name]):44} {shown(during[name])}")
    if response.status_code != 201:
        print(response.text[:300])
        return
    conversation = response.json()["conversations"][0]["id"]
    async with heavy_requests.page_client(server.url, importer) as client:
        start = time.monotonic()
        page = await client.get(f"/api/conversations/{conversation}")
        print(f"\nopening it: {len(page.content) / 1e6:.2f} MB, {len(page.json()['messages'])} messages,"
              f" {time.monotonic() - start:.2f} s")  # fmt: skip
        start, first, size = time.monotonic(), None, 0
        async with client.stream("GET", f"/api/conversations/{conversation}/export?format=md") as export:
            async for chunk in export.aiter_bytes():
                first = first or time.monotonic() - start
                size += len(chunk)
        whole = time.monotonic() - start
        print(f"its Markdown export: {size / 1e6:.2f} MB, first byte {first:.2f} s, whole {whole:.2f} s")
        start = time.monotonic()
        deleted = await client.delete(f"/api/conversations/{conversation}")
        print(f"deleting it: HTTP {deleted.status_code} in {time.monotonic() - start:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=settings.CHAT_IMPORT_MAX_MESSAGES)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", default="", help="PostgreSQL (an empty database); default a SQLite file")
    parser.add_argument("--server-root", default="", help="run the server of another checkout")
    parser.add_argument("--settle", type=float, default=0.0, help="seconds to wait for an import that logs nothing")
    args = parser.parse_args()
    if args.server_root:
        live.ROOT = Path(args.server_root).resolve()
        # One key for the sessions made here and that checkout's server (each checkout keeps its own otherwise).
        os.environ.setdefault("DJANGO_SECRET_KEY", settings.SECRET_KEY)
    app = FakeUpstream(api_key=KEY)
    with FakeServer(app) as fake, tempfile.TemporaryDirectory() as scratch:
        site = make_site(f"{scratch}/bench.sqlite3", f"{fake.url}/infyrence/v1", KEY, args.database_url)
        importer = heavy_requests.add_person(site.database_url, "dave")
        env = {"DATABASE_URL": site.database_url, "CHAT_IMPORT_MAX_MESSAGES": str(args.messages), "LOG_LEVEL": "INFO",
               "CHAT_IMPORT_MAX_BYTES": "10000000", "REQUEST_MAX_BYTES": "10000000"}  # fmt: skip
        with live.LiveServer(env) as server:
            print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, "
                  f"{'PostgreSQL' if args.database_url else 'SQLite'}, server from {live.ROOT}")  # fmt: skip
            asyncio.run(heavy_requests.first_ws_delta(server.url, site.session, MODEL))  # the model list, cached
            asyncio.run(measure(args, server, site, importer))


if __name__ == "__main__":
    main()
