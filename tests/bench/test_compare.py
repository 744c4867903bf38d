"""A smoke of bench/compare.py, so the benchmark cannot rot: one stream through each path, tiny parameters."""

import subprocess
import sys

import orjson
import pytest

from tests.live import ROOT


@pytest.mark.slow
def test_compare_runs_one_stream_through_each_path_and_writes_its_figures(tmp_path):
    tiny = ["--levels", "1", "--chunks", "3", "--delay", "1", "--requests", "2", "--rate-concurrency", "1",
            "--repeat", "2"]  # fmt: skip
    command = [sys.executable, "bench/compare.py", *tiny, "--no-litellm", "--no-chart", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    report = orjson.loads((tmp_path / "compare-latest.json").read_bytes())
    streams = {row["system"]: row for row in report["streams"]}
    assert set(streams) == {"direct", "ours /v1", "ours websocket"}
    for name, row in streams.items():
        assert (row["streams"], row["runs"], row["failed"], row["lost_chunks"]) == (1, 2, 0, 0), (name, row["errors"])
        assert row["ttft_p50_ms"] > 0 and row["chunk_p99_ms"] is not None, name
    for name in ("ours /v1", "ours websocket"):
        assert streams[name]["cpu_s"] > 0 and streams[name]["added_ttft_p50_ms"] is not None
    rates = {row["system"]: row for row in report["one_token"]}
    assert all(row["failed"] == 0 and row["per_second"] > 0 for row in rates.values()), rates
    assert rates["ours /v1"]["cpu_ms_per_request"] > 0
    assert report["websocket_connect_cpu_ms"] > 0
    assert "| ours websocket | 1 |" in done.stdout and "the median of 2 runs" in done.stdout  # the printed table
    assert done.stdout.count("ours websocket    1 streams:") == 2  # each run printed as it ends


@pytest.mark.slow
def test_soak_runs_two_short_rounds_and_reports_the_rss_after_each(tmp_path):
    tiny = ["--streams", "2", "--minutes", "0.02", "--chunks", "3", "--delay", "1", "--settle", "0.5"]
    done = subprocess.run([sys.executable, "bench/soak.py", *tiny, "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = orjson.loads((tmp_path / "soak-latest.json").read_bytes())
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    for row in report["rounds"]:
        assert row["streams_run"] >= 2 and row["failed"] == 0 and row["lost_chunks"] == 0, row["errors"]
        assert row["rss_after_mib"] > 0
    assert "growth" in done.stdout


@pytest.mark.cluster
@pytest.mark.timeout(480)  # two servers, two upstream and two client processes start: minutes on a busy machine
def test_scaleout_runs_streams_over_two_processes_on_postgresql_and_redis(tmp_path):
    tiny = ["--streams", "2", "--chunks", "3", "--delay", "1", "--clients", "2", "--upstreams", "2"]
    done = subprocess.run([sys.executable, "bench/scaleout.py", *tiny, "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=480)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = orjson.loads((tmp_path / "scaleout-latest.json").read_bytes())
    assert (report["processes"], report["clients"], report["upstreams"]) == (2, 2, 2)
    assert [row["path"] for row in report["results"]] == ["direct", "/v1", "direct", "websocket"]
    for row in report["results"]:
        assert (row["streams"], row["failed"], row["lost_chunks"]) == (2, 0, 0), (row["path"], row["errors"])
        assert row["ttft_p50_ms"] > 0
        if row["path"] != "direct":  # where its starts waited: PostgreSQL's locks, a database thread
            assert row["lock_wait_ms_per_start"] is not None and row["thread_wait_ms_per_start"] is not None


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_start_bench_times_starts_on_each_database(database):
    from tests.services import url_of

    more = ["--database-url", url_of("postgres")] if database == "postgresql" else []
    done = subprocess.run([sys.executable, "bench/start_bench.py", "--starts", "5", *more], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    vendor = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[database]
    assert f"{vendor}: 5 starts and ends, one after another" in done.stdout and "wall" in done.stdout
