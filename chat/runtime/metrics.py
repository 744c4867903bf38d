"""The server's Prometheus metrics (GET /metrics, docs/operations.md#metrics): counters kept in memory.

Every value here changes at most a few times per stream (its start and its end), never per
token: the hot path pays for an increment of a number in memory and nothing else.

Several server processes on one machine: with PROMETHEUS_MULTIPROC_DIR set (before the process
starts; deploy/systemd/daphne@.service sets it), prometheus-client keeps each process's values
in small memory-mapped files in that folder, and whichever process answers /metrics adds them
all up, so a scrape through nginx sees the machine's totals. Counters of a process that exited
stay in the folder (the totals never go backwards); its gauges ("livesum") are dropped when it
exits, or, after a kill -9, when the next process starts (`forget_dead_processes`). Without the
variable each process counts for itself (one process, the default install).
"""

from __future__ import annotations

import glob
import os
import re

# prometheus-client turns its multiprocess mode on when the variable exists at all: an empty one
# (`PROMETHEUS_MULTIPROC_DIR=` in an env file) means per process, as documented.
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR", "x"):
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds: from a stream's start to its first token; a whole stream.
FIRST_TOKEN_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60)
DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)

# path: "chat" (the page), "api" (/v1), "title" (a model-written title), as Usage.source says.
streams_running = Gauge(
    "chat_streams_running", "Streams running on this machine's processes now", ["path"], multiprocess_mode="livesum"
)
streams_started = Counter("chat_streams_started", "Streams started (their usage row written)", ["path", "provider"])
streams_ended = Counter(
    "chat_streams_ended",
    "Streams ended and stored, by how: complete, stopped, interrupted, failed",
    ["path", "provider", "status"],
)
upstream_failures = Counter(
    "chat_upstream_failures",
    "Upstream requests that failed, by reason: http (an error status), connect, timeout, cut, protocol, busy",
    ["provider", "reason"],
)
first_token_seconds = Histogram(
    "chat_stream_first_token_seconds", "Time to the first token", ["path"], buckets=FIRST_TOKEN_BUCKETS
)
stream_seconds = Histogram("chat_stream_duration_seconds", "A stream's duration", ["path"], buckets=DURATION_BUCKETS)
tokens = Counter("chat_tokens", "Tokens of ended streams (kind: prompt, completion)", ["path", "provider", "kind"])
cost_usd = Counter("chat_cost_usd", "Cost of ended streams, USD (reported or priced)", ["path", "provider"])
budget_refusals = Counter("chat_budget_refusals", "Streams refused over a monthly budget", ["path"])
db_save_retries = Counter(
    "chat_db_save_retries",
    "Stream saves retried because the database was unavailable (what: partial, final, api_usage)",
    ["what"],
)
db_unavailable = Counter(
    "chat_db_unavailable", "Requests and frames answered 503 / server_busy: the database could not be had", ["where"]
)
db_wait_seconds = Histogram(
    "chat_db_wait_seconds",
    "How long a stream's final save waited for the database (only saves that had to retry)",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
# A start's waits in a burst: for a database thread (its connection), and for a busy PostgreSQL (no
# connection to be had, a lock that timed out) before it went on or, past DATABASE_BUSY_WAIT_SECONDS, gave up.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
db_thread_wait_seconds = Histogram(
    "chat_db_thread_wait_seconds", "How long a call waited for a database thread (and its connection)",
    buckets=WAIT_BUCKETS,
)  # fmt: skip
db_busy_wait_seconds = Histogram(
    "chat_db_busy_wait_seconds",
    "How long a start waited for a busy database (outcome: went_on, gave_up); only starts that had to wait",
    ["outcome"],
    buckets=WAIT_BUCKETS,
)
channel_layer_up = Gauge(
    "chat_channel_layer_up", "1 while this process reaches the channel layer (Redis)", multiprocess_mode="livemin"
)
channel_layer_reconnects = Counter(
    "chat_channel_layer_reconnects", "Times the channel layer was reached again after failing"
)
websockets_open = Gauge("chat_websockets_open", "Open chat websockets", multiprocess_mode="livesum")
websocket_refusals = Counter(
    "chat_websocket_refusals", "Websocket connects refused (reason: overload, database, origin, session)", ["reason"]
)
interrupted_after_crash = Counter(
    "chat_streams_interrupted_after_crash", "Streams of a dead process marked interrupted by a live one"
)
ready = Gauge(
    "chat_ready",
    "1 when the last readiness check found this part reachable (part: database, channel_layer, provider)",
    ["part"],
    multiprocess_mode="livemostrecent",
)
stuck_streams = Gauge(
    "chat_streams_stuck",
    "Rows still streaming past UPSTREAM_DEADLINE and a minute (read at each scrape)",
    multiprocess_mode="livemostrecent",
)


def exposition() -> bytes:
    """Every metric in Prometheus's text format: this machine's processes added up, or this process's."""
    if not MULTIPROCESS_DIR:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)


PID_FILE = re.compile(r"_(\d+)\.db$")


def forget_dead_processes() -> None:
    """Drop the live gauges a killed process left in the shared folder (its counters stay)."""
    if not MULTIPROCESS_DIR:
        return
    for path in glob.glob(os.path.join(MULTIPROCESS_DIR, "gauge_live*_*.db")):
        found = PID_FILE.search(path)
        if found is None:
            continue
        pid = int(found.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, MULTIPROCESS_DIR)
        except PermissionError:
            pass  # alive, another user's


def process_exits() -> None:
    """This process's live gauges leave the sums (its counters stay)."""
    if MULTIPROCESS_DIR:
        multiprocess.mark_process_dead(os.getpid(), MULTIPROCESS_DIR)
