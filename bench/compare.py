"""Our server against the floor (straight to the upstream) and LiteLLM's proxy, measured interleaved in one run.

Starts the fake upstream (fakeupstream/app.py, uvicorn), our server (chatsite.server, a fresh
SQLite database in a temporary folder; with --database-url a second one on that PostgreSQL database, `ours-pg`,
measured beside it in the same run) and, when `make bench-deps` has
installed bench/requirements.lock into bench/.venv, LiteLLM's proxy (one worker, the same
upstream). Each concurrency level runs every system in turn, so a load spike from other work
on the machine falls on all of them alike. Per system and path it measures:

- time to first token (request sent -> first content chunk received) and per-chunk latency
  (the upstream stamps each piece with its send time), p50/p95/p99, and what each adds over the
  direct path at the same concurrency;
- one-token requests a second, and the server's CPU per stream start (its process CPU clock), and
  for ours-pg PostgreSQL's (every `postgres` process on this machine, in clock ticks): on a small
  machine the database's backends take their CPU from the same cores;
- server CPU per chunk: the run's CPU less that of as many one-chunk streams at once (their
  starts, sockets and ends, at the same concurrency), over the chunks more they delivered;
- the server's CPU to open and close a chat websocket;
- RSS per stream (peak RSS during the run less RSS before it, over the streams);
- failed streams (an error or no end) and lost chunks.

It prints a table and writes bench/results/compare-<time>.json, compare-latest.json and (with
bench/.venv's matplotlib, bench/chart.py) compare-latest.png.

    .venv/bin/python bench/compare.py                          # the full run, ~10 minutes
    .venv/bin/python bench/compare.py --levels 1 10 --chunks 20 --no-litellm
    .venv/bin/python bench/compare.py --repeat 3               # each figure the median of 3 runs

With --repeat, every measurement runs that many times, interleaved across the systems, and the
table shows each figure's median (failed streams and lost chunks are summed): on a machine whose
speed drifts within minutes, one run of a level says little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_bench import KEY, MODEL, STAMP, cpu_seconds, free_port, server_env  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BENCH_VENV = ROOT / "bench" / ".venv"


def wait_http(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(url, timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


class Stack:
    """The fake upstream, our server and (if installed) LiteLLM's proxy, each in its own process."""

    def __init__(
        self, database_url: str | None, litellm: bool, servers: int = 1, env: dict | None = None, users: int = 1,
        upstreams: int = 1,
    ) -> None:  # fmt: skip
        self.processes: list[subprocess.Popen] = []
        self.users = users
        self.upstreams = upstreams  # the fake upstream's processes (uvicorn's workers, on one port)
        try:
            self.start(database_url, litellm, servers, env or {})
        except BaseException:
            self.close()
            raise

    def start(self, database_url: str | None, litellm: bool, servers: int = 1, env: dict | None = None) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="chat-compare-")
        fake_port, self.port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = server_env(
            database_url or f"sqlite:///{self.folder.name}/bench.sqlite3",
            fake_port,
            # A new conversation's first answer is followed by a title request (chat/actions/titles.py): one
            # more upstream request per websocket stream, which LiteLLM and /v1 do not make. Off, so
            # the paths compare like for like; README says what a title costs.
            CHAT_TITLES="0",
            # The connect-storm guards are off (400 sockets opening at once is the load under test,
            # not an attack), and a socket may send as fast as the one-token rate asks (a tab
            # sends a few frames a second).
            WS_CONNECTS_PER_SECOND="0",
            WS_MAX_CONNECTING="0",
            CHAT_FRAME_RATE="100000",
            CHAT_FRAME_BURST="100000",
            **(env or {}),
        )
        self.upstream = self.env["UPSTREAM_BASE_URL"]  # LiteLLM's and the direct path's upstream too
        self.fake = self.spawn(
            [sys.executable, "-m", "uvicorn", "fakeupstream.app:app", "--port", str(fake_port), "--log-level",
             "warning", "--no-access-log", *(["--workers", str(self.upstreams)] if self.upstreams > 1 else [])],
        )  # fmt: skip
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=self.env, check=True)
        # `users` people (bench, bench1, ...), each with a session and a token: the i-th stream is person i mod users's.
        script = (
            "from django.contrib.auth.models import User; from chat.models import ApiToken;"
            "from django.test import Client\n"
            f"for n in range({self.users}):\n"
            "    u = User.objects.create_user(f'bench{n or \"\"}', password='x')\n"
            "    c = Client(); c.force_login(u); print(c.cookies['sessionid'].value, ApiToken.issue(u, 'bench')[1])"
        )
        out = subprocess.run([*manage, "shell", "-c", script], cwd=ROOT, env=self.env, check=True, capture_output=True)
        words = out.stdout.decode().split()[-2 * self.users :]
        self.cookies, self.tokens = words[0::2], words[1::2]
        self.cookie, self.token = self.cookies[0], self.tokens[0]
        # More than one: processes sharing the database (and, with REDIS_URL in env, Redis), each on its port.
        ports = [self.port] + [free_port() for _ in range(servers - 1)]
        self.urls = [f"http://127.0.0.1:{port}" for port in ports]
        command = [sys.executable, "-m", "chatsite.server", "-b", "127.0.0.1", "-p"]
        self.servers = [self.spawn([*command, str(port), "chatsite.asgi:application"]) for port in ports]
        self.server = self.servers[0]
        self.litellm_url = None
        self.litellm = None
        if litellm and (BENCH_VENV / "bin" / "litellm").exists():
            self.litellm = self.start_litellm()
        wait_http(f"http://127.0.0.1:{fake_port}/", self.fake)
        for url, server in zip(self.urls, self.servers, strict=True):
            wait_http(url + "/v1/models", server)  # any answer (a 401) will do
        if self.litellm is not None:
            wait_http(self.litellm_url + "/health/liveliness", self.litellm, timeout=120)

    def spawn(self, command: list[str], env: dict | None = None) -> subprocess.Popen:
        process = subprocess.Popen(command, cwd=ROOT, env=env or self.env, stdout=subprocess.DEVNULL)
        self.processes.append(process)
        return process

    def start_litellm(self) -> subprocess.Popen:
        port = free_port()
        self.litellm_url = f"http://127.0.0.1:{port}"
        config = Path(self.folder.name) / "litellm.yaml"
        config.write_text(
            json.dumps(
                {
                    "model_list": [
                        {
                            "model_name": MODEL,
                            "litellm_params": {"model": f"openai/{MODEL}", "api_base": self.upstream, "api_key": KEY},
                        }
                    ],
                    "litellm_settings": {"drop_params": True, "set_verbose": False},
                }
            )
        )  # JSON is YAML
        # A master key, as LiteLLM requires; with no database it is the only key (compared per request).
        self.litellm_key = "sk-" + secrets.token_hex(32)
        env = {
            "LITELLM_MASTER_KEY": self.litellm_key,
            "LITELLM_LOG": "ERROR",
            "DISABLE_SCHEMA_UPDATE": "true",
            "LITELLM_TELEMETRY": "False",
        }
        # Its DATABASE_URL would be ours: without one it keeps no database, as configured here.
        env = {**{k: v for k, v in self.env.items() if k != "DATABASE_URL"}, **env}
        return self.spawn(
            [str(BENCH_VENV / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
             "--num_workers", "1"],
            env=env,
        )  # fmt: skip

    def close(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.folder.cleanup()


class Run:
    """The streams of one system at one concurrency: what each client saw."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.latencies: list[float] = []
        self.failed = 0
        self.lost = 0
        self.errors: list[str] = []

    def fail(self, why: str) -> None:
        self.failed += 1
        if len(self.errors) < 3:
            self.errors.append(why[:300])


async def openai_stream(session, url: str, headers: dict, prompt: str, chunks: int, run: Run) -> None:
    """One streamed chat completion over HTTP (direct, our /v1, LiteLLM)."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    got = 0
    sent = time.time()
    try:
        async with session.post(url + "/chat/completions", json=body, headers=headers) as response:
            if response.status != 200:
                return run.fail(f"{response.status} {(await response.read())[:200]!r}")
            done = False
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: {"):
                    received = time.time()
                    choices = orjson.loads(line[6:]).get("choices") or []
                    text = (choices[0].get("delta") or {}).get("content") if choices else None
                    if text:
                        stamps = STAMP.findall(text)
                        if got == 0 and stamps:
                            run.ttft.append(received - sent)
                        got += len(stamps)
                        run.latencies.extend(received - float(stamp) for stamp in stamps)
                elif line.startswith(b"data: ") and b"error" in line:
                    return run.fail(line.decode(errors="replace"))
            if not done:
                return run.fail("no [DONE]")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return run.fail(repr(exc))
    run.lost += max(0, chunks - got)


def socket_headers(stack: Stack) -> dict:
    return {"Origin": stack.url, "Cookie": f"sessionid={stack.cookie}"}


async def websocket_stream(session, stack: Stack, prompt: str, chunks: int, run: Run) -> None:
    """One answer on the chat page's websocket: connect (not timed), send, read deltas until done."""
    try:
        async with session.ws_connect(
            stack.url.replace("http", "ws") + "/ws/chat/", headers=socket_headers(stack)
        ) as ws:
            await websocket_answer(ws, prompt, chunks, run)
    except aiohttp.WSServerHandshakeError as exc:
        run.fail(f"handshake refused: {exc.status} {exc.message}")
    except (TimeoutError, aiohttp.ClientError) as exc:
        run.fail(repr(exc))


async def websocket_answer(ws, prompt: str, chunks: int, run: Run) -> None:
    """Send a message in a new conversation on an open socket and read its answer."""
    got = 0
    sent = time.time()
    await ws.send_str(orjson.dumps({"type": "send", "conversation": None, "content": prompt}).decode())
    async for message in ws:
        if message.type != aiohttp.WSMsgType.TEXT:
            return run.fail(f"socket closed: {message.type} {message.data}")
        received = time.time()
        frame = orjson.loads(message.data)
        if frame["type"] == "delta":
            stamps = STAMP.findall(frame.get("content", ""))
            if got == 0 and stamps:
                run.ttft.append(received - sent)
            got += len(stamps)
            run.latencies.extend(received - float(stamp) for stamp in stamps)
        elif frame["type"] == "error":
            return run.fail(f"error frame {frame}")
        elif frame["type"] == "done":
            if frame.get("status") != "complete":
                return run.fail(f"done {frame.get('status')}: {frame.get('error')}")
            break
    else:
        return run.fail("socket closed before done")
    run.lost += max(0, chunks - got)


def systems(stack: Stack, beside: Stack | None = None) -> dict[str, tuple]:
    """name -> (pid whose CPU and RSS count, how to run one stream).

    `beside`: a second server of ours on PostgreSQL (--database-url), measured as `ours-pg` next to SQLite's.
    """
    auth = {"Authorization": f"Bearer {stack.token}"}
    found = {
        "direct": (
            None,
            lambda s, p, c, r: openai_stream(s, stack.upstream, {"Authorization": f"Bearer {KEY}"}, p, c, r),
        ),
        "ours /v1": (stack.server.pid, lambda s, p, c, r: openai_stream(s, stack.url + "/v1", auth, p, c, r)),
        "ours websocket": (stack.server.pid, lambda s, p, c, r: websocket_stream(s, stack, p, c, r)),
    }
    if beside is not None:
        pg_auth = {"Authorization": f"Bearer {beside.token}"}
        found["ours-pg /v1"] = (
            beside.server.pid,
            lambda s, p, c, r: openai_stream(s, beside.url + "/v1", pg_auth, p, c, r),
        )
        found["ours-pg websocket"] = (beside.server.pid, lambda s, p, c, r: websocket_stream(s, beside, p, c, r))
    if stack.litellm is not None:
        lite = {"Authorization": f"Bearer {stack.litellm_key}"}
        found["LiteLLM /v1"] = (
            stack.litellm.pid,
            lambda s, p, c, r: openai_stream(s, stack.litellm_url + "/v1", lite, p, c, r),
        )
    return found


async def measure(one, pid: int | None, streams: int, chunks: int, delay: int) -> dict:
    """`streams` concurrent streams of `chunks` stamped chunks `delay` ms apart."""
    prompt = f"[[stamp]] [[chunks:{chunks}]] [[delay:{delay}]] [[reasoning:0]]"
    run = Run()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        rss_before = rss_bytes(pid) if pid else 0
        peak = rss_before
        cpu, wall = (cpu_seconds(pid) if pid else 0.0), time.perf_counter()
        work = asyncio.gather(*(one(session, prompt, chunks, run) for _ in range(streams)))
        while not work.done():
            await asyncio.wait([work], timeout=0.1)
            if pid:
                peak = max(peak, rss_bytes(pid))
        cpu = (cpu_seconds(pid) - cpu) if pid else None
        wall = time.perf_counter() - wall
    return {
        "streams": streams,
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_per_stream_kib": (peak - rss_before) / streams / 1024 if pid else None,
        "failed": run.failed,
        "lost_chunks": run.lost,
        "errors": run.errors,
        **{f"ttft_p{p}_ms": ms(percentile(run.ttft, p / 100)) for p in (50, 95, 99)},
        **{f"chunk_p{p}_ms": ms(percentile(run.latencies, p / 100)) for p in (50, 95, 99)},
    }


async def one_token_rate(one, pid: int | None, requests: int, concurrency: int, stack: Stack | None = None) -> dict:
    """`requests` one-token answers, `concurrency` at a time: requests a second and CPU per request.

    With `stack`, on websockets: each worker keeps its socket open between answers, like a tab.
    """
    run = Run()
    queue = iter(range(requests))
    prompt = "[[stamp]] [[chunks:1]] [[reasoning:0]]"

    async def worker(session):
        if stack is None:
            for _ in queue:
                await one(session, prompt, 1, run)
            return
        async with session.ws_connect(
            stack.url.replace("http", "ws") + "/ws/chat/", headers=socket_headers(stack)
        ) as ws:
            for _ in queue:
                await websocket_answer(ws, prompt, 1, run)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        cpu, wall = (cpu_seconds(pid) if pid else 0.0), time.perf_counter()
        database = postgres_cpu_seconds()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        cpu = (cpu_seconds(pid) - cpu) if pid else None
        database = postgres_cpu_seconds() - database
        wall = time.perf_counter() - wall
    return {
        "requests": requests,
        "per_second": requests / wall,
        "cpu_ms_per_request": cpu / requests * 1000 if cpu is not None else None,
        "postgres_cpu_ms_per_request": database / requests * 1000,
        "failed": run.failed,
        "errors": run.errors,
    }


def postgres_cpu_seconds() -> float:
    """CPU time of this machine's PostgreSQL processes (its backends and its own), in clock ticks; 0 without it."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, fields = stat.read_text().split(" (", 1)[1].rsplit(") ", 1)
        except (OSError, IndexError, ValueError):  # ended while read
            continue
        if name == "postgres":
            total += sum(int(field) for field in fields.split()[11:13])
    return total / os.sysconf("SC_CLK_TCK")


async def websocket_connects(stack: Stack, pid: int, count: int, concurrency: int) -> float:
    """Server CPU in ms to open and close one chat websocket, with no answer on it (measure() opens one a stream)."""
    queue = iter(range(count))
    url = stack.url.replace("http", "ws") + "/ws/chat/"

    async def worker(session):
        for _ in queue:
            async with session.ws_connect(url, headers=socket_headers(stack)) as ws:
                await ws.close()  # returns once the server's close frame is in

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        cpu = cpu_seconds(pid)
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return (cpu_seconds(pid) - cpu) / count * 1000


# Summed over repeated runs; any other number is the runs' median.
SUMMED = ("failed", "lost_chunks")


def median_of(runs: list[dict]) -> dict:
    """One result from repeated runs of the same measurement."""
    combined = dict(runs[0])
    for key, value in runs[0].items():
        if key in SUMMED:
            combined[key] = sum(run[key] for run in runs)
        elif key == "errors":
            combined[key] = [error for run in runs for error in run[key]]
        elif isinstance(value, (int, float)) or value is None:
            values = [run[key] for run in runs if run[key] is not None]
            # (a setting, such as the number of streams, is the same in each run and stays as it is)
            combined[key] = statistics.median(values) if len(set(values)) > 1 else next(iter(values), None)
    combined["runs"] = len(runs)
    return combined


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def added(result: dict, floor: dict | None) -> None:
    """What the system adds over the direct path at the same concurrency."""
    for key in ("ttft_p50_ms", "ttft_p99_ms", "chunk_p50_ms", "chunk_p99_ms"):
        mine, base = result.get(key), (floor or {}).get(key)
        result["added_" + key] = None if mine is None or base is None else mine - base


def cpu_per_chunk(result: dict, baseline: dict | None, chunks: int) -> None:
    """The run's CPU less `baseline`'s (as many one-chunk streams at once), over the chunks more.

    What a stream costs besides its chunks (the start, a websocket's open and close, the final
    save) depends on how many start together, so it is measured at the same concurrency and
    taken out whole, not estimated from one-token answers ten at a time.
    """
    result["baseline_cpu_s"] = None if baseline is None else baseline["cpu_s"]
    if result["cpu_s"] is None or result["baseline_cpu_s"] is None:
        result["cpu_us_per_chunk"] = None
        return
    delivered = (result["streams"] - result["failed"]) * chunks - result["lost_chunks"]
    more = delivered - (baseline["streams"] - baseline["failed"] - baseline["lost_chunks"])
    streaming = max(0.0, result["cpu_s"] - baseline["cpu_s"])
    result["cpu_us_per_chunk"] = streaming / more * 1e6 if more > 0 else None


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, load average {load:.1f} at the start"


def fmt(value, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def print_table(report: dict) -> None:
    runs = report.get("repeat", 1)
    medians = f"; each figure the median of {runs} runs" if runs > 1 else ""
    print(f"\n{report['chunks']} chunks a stream, {report['delay_ms']} ms apart{medians}; {report['machine']}\n")
    header = ("system", "streams", "TTFT p50/p95/p99 ms", "+TTFT p50", "chunk p50/p95/p99 ms", "+chunk p50/p99",
              "CPU µs/chunk", "RSS KiB/stream", "failed", "lost")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in report["streams"]:
        print(
            "| "
            + " | ".join(
                [
                    row["system"],
                    str(row["streams"]),
                    "/".join(fmt(row[f"ttft_p{p}_ms"]) for p in (50, 95, 99)),
                    fmt(row["added_ttft_p50_ms"]),
                    "/".join(fmt(row[f"chunk_p{p}_ms"]) for p in (50, 95, 99)),
                    fmt(row["added_chunk_p50_ms"]) + "/" + fmt(row["added_chunk_p99_ms"]),
                    fmt(row["cpu_us_per_chunk"], ".0f"),
                    fmt(row["rss_per_stream_kib"], ".0f"),
                    str(row["failed"]),
                    str(row["lost_chunks"]),
                ]
            )
            + " |"
        )
    print(
        "\n| system | one-token requests/s | server CPU ms per stream start | PostgreSQL's CPU ms per start | failed |"
        "\n|---|---|---|---|---|"
    )
    for row in report["one_token"]:
        database = row.get("postgres_cpu_ms_per_request") if row["system"].startswith("ours-pg") else None
        print(
            f"| {row['system']} | {row['per_second']:.0f} | {fmt(row['cpu_ms_per_request'], '.2f')} | "
            f"{fmt(database, '.2f')} | {row['failed']} |"
        )
    if "websocket_connect_cpu_ms" in report:
        print(f"\nServer CPU to open and close a chat websocket: {report['websocket_connect_cpu_ms']:.2f} ms "
              "(each websocket stream above opens one)")  # fmt: skip


def print_ratios(report: dict) -> None:
    """PostgreSQL's added time to first token over SQLite's, per path and level, from the same run."""
    rows = {(row["system"], row["streams"]): row for row in report["streams"]}
    print("\n| path | streams | +TTFT p50 SQLite / PostgreSQL ms | ratio | +TTFT p99 SQLite / PostgreSQL ms | ratio |")
    print("|---|---|---|---|---|---|")
    for (system, streams), row in rows.items():
        if not system.startswith("ours ") or (pg := rows.get((system.replace("ours", "ours-pg"), streams))) is None:
            continue
        cells = []
        for key in ("added_ttft_p50_ms", "added_ttft_p99_ms"):
            mine, theirs = row[key], pg[key]
            ratio = theirs / mine if mine and theirs is not None and mine > 0 else None
            cells += [f"{fmt(mine)} / {fmt(theirs)}", fmt(ratio, ".2f")]
        print(f"| {system[5:]} | {streams} | " + " | ".join(cells) + " |")


def draw(path: Path) -> Path | None:
    """The chart, drawn by bench/chart.py with bench/.venv's matplotlib (not in the server's locks)."""
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        print("no chart: `make bench-deps` installs matplotlib into bench/.venv")
        return None
    chart = path.with_suffix(".png")
    subprocess.run([str(python), str(ROOT / "bench" / "chart.py"), str(path), str(chart)], check=True)
    return chart


async def run_all(stack: Stack, args, beside: Stack | None = None) -> dict:
    found = systems(stack, beside)
    sockets = {"ours websocket": stack, "ours-pg websocket": beside}
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "chunks": args.chunks,
        "delay_ms": args.delay,
        "repeat": args.repeat,
        "systems": list(found),
        "one_token": [],
        "streams": [],
    }
    # Warm every path (imports, connections, the first conversation) before anything is timed.
    for pid, one in found.values():
        await measure(one, pid, min(5, args.levels[0]), 2, 1)
    rates: dict[str, list[dict]] = {name: [] for name in found}
    connects = []
    pid = found["ours websocket"][0]
    for _ in range(args.repeat):
        for name, (system_pid, one) in found.items():
            socket = sockets.get(name)
            rate = await one_token_rate(one, system_pid, args.requests, args.rate_concurrency, socket)
            rates[name].append(rate)
            print(
                f"one-token {name}: {rate['per_second']:.0f}/s, CPU {fmt(rate['cpu_ms_per_request'], '.2f')} ms"
                + (f", PostgreSQL's {rate['postgres_cpu_ms_per_request']:.2f}" if name.startswith("ours-pg") else ""),
                flush=True,
            )
        connects.append(await websocket_connects(stack, pid, args.requests, args.rate_concurrency))
        print(f"websocket open and close: CPU {connects[-1]:.2f} ms", flush=True)
    report["websocket_connect_cpu_ms"] = statistics.median(connects)
    for name in found:
        report["one_token"].append({"system": name, **median_of(rates[name])})
    for streams in args.levels:
        runs: dict[str, list[dict]] = {name: [] for name in found}
        for _ in range(args.repeat):
            for name, (system_pid, one) in found.items():
                baseline = await measure(one, system_pid, streams, 1, args.delay) if system_pid else None
                result = await measure(one, system_pid, streams, args.chunks, args.delay)
                cpu_per_chunk(result, baseline, args.chunks)
                runs[name].append(result)
                print(
                    f"{name:>15} {streams:>4} streams: TTFT p50 {fmt(result['ttft_p50_ms'])} ms, chunk p50/p99 "
                    f"{fmt(result['chunk_p50_ms'])}/{fmt(result['chunk_p99_ms'])} ms, failed {result['failed']}, "
                    f"lost {result['lost_chunks']} {result['errors'][:1]}",
                    flush=True,
                )
        floor = None
        for name in found:
            result = {"system": name, **median_of(runs[name])}
            if name == "direct":
                floor = result
            added(result, floor)
            report["streams"].append(result)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 10, 100, 200, 400], help="concurrent streams")
    parser.add_argument("--chunks", type=int, default=100, help="content chunks a stream")
    parser.add_argument("--delay", type=int, default=20, help="ms between chunks (20: 50 a second)")
    parser.add_argument("--requests", type=int, default=300, help="one-token requests for the rate")
    parser.add_argument("--rate-concurrency", type=int, default=10, help="one-token requests at a time")
    parser.add_argument(
        "--database-url",
        help="a PostgreSQL database for a second server of ours (ours-pg), measured beside SQLite's (ours)",
    )
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out even if installed")
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and the chart")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the table shows medians")
    args = parser.parse_args()
    stack = Stack(None, litellm=not args.no_litellm)
    beside = None
    try:
        beside = Stack(args.database_url, litellm=False) if args.database_url else None
        report = asyncio.run(run_all(stack, args, beside))
    finally:
        stack.close()
        if beside is not None:
            beside.close()
    print_table(report)
    if beside is not None:
        print_ratios(report)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = report["when"].replace(":", "").replace("+0000", "")
    for name in (f"compare-{stamp}.json", "compare-latest.json"):
        (args.out / name).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    if not args.no_chart and (chart := draw(args.out / "compare-latest.json")):
        print(f"chart: {chart}")
    failed = sum(row["failed"] for row in report["streams"] + report["one_token"])
    print(f"results: {args.out / 'compare-latest.json'}; failed streams: {failed}")


if __name__ == "__main__":
    main()
