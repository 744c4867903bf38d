"""Large /v1 bodies of many small messages, and how long the rest of the server waits meanwhile.

Starts the real server (a fresh SQLite database in a temporary folder) on 127.0.0.1, makes one
API token, then posts `--bodies` bodies at once of `--messages` one-letter messages each (850,000
is about 25 MB, under API_MAX_BODY_BYTES), once with a token the server does not know and once
with the real one (its model does not exist: the answer is a 404 after the body is checked).
Meanwhile a probe asks for /healthz one request after another. Prints, for each: the statuses,
how long the bodies took, and the probe's worst and median latency.

    .venv/bin/python bench/large_bodies.py
    .venv/bin/python bench/large_bodies.py --bodies 2 --messages 200000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.live import LiveServer  # noqa: E402

SETUP = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from chat.models import ApiToken
print(ApiToken.issue(get_user_model().objects.create_user("bench"), "bench")[1])
"""


async def run(url: str, token: str, body: bytes, bodies: int) -> str:
    async with httpx.AsyncClient(timeout=300) as client:
        latencies: list[float] = []
        stop = asyncio.Event()

        async def probe() -> None:
            while not stop.is_set():
                began = time.monotonic()
                await client.get(url + "/healthz")
                latencies.append(time.monotonic() - began)

        prober = asyncio.create_task(probe())
        began = time.monotonic()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        answers = await asyncio.gather(
            *(client.post(url + "/v1/chat/completions", content=body, headers=headers) for _ in range(bodies))
        )
        took = time.monotonic() - began
        stop.set()
        await prober
    latencies.sort()
    worst, median = latencies[-1] * 1000, latencies[len(latencies) // 2] * 1000
    return (
        f"statuses {sorted(a.status_code for a in answers)}, answered in {took:.1f} s; "
        f"/healthz worst {worst:.0f} ms, median {median:.0f} ms ({len(latencies)} probes)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bodies", type=int, default=6, help="bodies posted at once")
    parser.add_argument("--messages", type=int, default=850_000, help="one-letter messages in each body")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bodies-")
    database = f"sqlite:///{folder}/bodies.sqlite3"
    env = {**os.environ, "DATABASE_URL": database, "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    token = subprocess.check_output([sys.executable, "-c", SETUP], cwd=ROOT, env=env, text=True).split()[-1]
    body = orjson.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "a"}] * args.messages})
    print(f"{args.bodies} bodies of {len(body) / 1e6:.1f} MB at once")
    with LiveServer({"DATABASE_URL": database}) as live:
        print("  an unknown token:", asyncio.run(run(live.url, "sk-chat-unknown", body, args.bodies)))
        print("  a known token:   ", asyncio.run(run(live.url, token, body, args.bodies)))


if __name__ == "__main__":
    main()
