"""/v1 with the real litellm client (litellm.completion, the version in bench/requirements.lock).

litellm stays out of the tests' lock: it runs in bench/.venv (`make bench-deps`, which `make test`
runs first), one process per dialect running tests/litellm_client/chat.py's scenarios against the
real server on the fake upstream and printing their results as one JSON line: two turns and a
two-step tool loop with a reasoning model, streaming (litellm's chunks, put together by
litellm.stream_chunk_builder) and not, each reply appended as litellm gives it.
"""

import json
import os
import subprocess

import pytest

from chat.models import ApiToken, Usage
from tests.conftest import DIALECTS
from tests.live import ROOT

# slow: a process each, whose `import litellm` alone takes seconds, and eight requests through the server.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BENCH_PYTHON = ROOT / "bench" / ".venv" / "bin" / "python"
SCRIPT = ROOT / "tests" / "litellm_client" / "chat.py"
# A reasoning model per dialect (the script adds [[reasoning:3]], so infyrence's thinks too).
REASONING = {
    "i14": "i14-sugarglider-nemotron3-super-120B-v1",
    "api14": "deepseek/deepseek-r1",
    "infyrence": "claude-sonnet-5",
}
TWO_TURNS = ["first question", "second question"]
TOOL_TEXT = "Tool results: sunny in Paris; sunny in Tokyo"
# Offline and quiet: litellm would fetch its price list from GitHub and report telemetry.
QUIET = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR"}


@pytest.fixture
def token(alice):
    return ApiToken.issue(alice, "litellm")[1]


def run_litellm(server, token: str, model: str) -> dict:
    """The scenarios' results, by name, from one run of the script under bench/.venv's Python."""
    if not BENCH_PYTHON.exists():
        reason = "litellm runs from bench/.venv, which is absent: `make bench-deps` (or `make test`) makes it"
        if os.environ.get("BENCH_VENV_REQUIRED"):  # set by `make test`, which has just made it
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run(
        [str(BENCH_PYTHON), str(SCRIPT)],
        cwd=ROOT,
        env={**os.environ, **QUIET, "API_BASE_URL": server.url + "/v1", "API_TOKEN": token, "API_MODEL": model},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def failed(results: dict) -> str:
    """The failed scenarios, one a line with litellm's error (empty if none failed)."""
    return "\n".join(f"{name}: {r['status']} {r['error']}" for name, r in results.items() if not r["ok"])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_litellm_two_turns_and_tool_loops_append_its_reply_as_given(server, token, providers, fake, dialect):
    results = run_litellm(server, token, REASONING[dialect])
    assert not failed(results), failed(results)
    for suffix in ("", "_stream"):
        turns = results[f"two_turns{suffix}"]
        assert turns["texts"] == TWO_TURNS, turns
        loop = results[f"tool_loop{suffix}"]
        assert loop["finish"] == "tool_calls" and loop["calls"] == ["get_weather", "get_weather"], loop
        assert loop["text"] == TOOL_TEXT, loop
        for name, reply in ((f"two_turns{suffix}", turns), (f"tool_loop{suffix}", loop)):
            # The reasoning came back as litellm's reasoning_content, and went back with the reply.
            assert reply["reasoning"] and "reasoning_content" in reply["sent_back"], (name, reply)
    assert results["two_turns_stream"]["deltas"] == TWO_TURNS[0]  # the chunks' content is the built answer's
    assert results["two_turns_stream"]["usage"]["completion_tokens"] > 0
    # The last request's history: the tool-calling reply went upstream without what litellm added.
    history = fake.app.last().body["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "tool"]
    assert not {"reasoning_content", "provider_specific_fields", "thinking_blocks"} & set(history[1])
    rows = Usage.objects.filter(token__name="litellm")
    assert list(rows.values_list("status", flat=True)) == ["complete"] * 8  # one metered row per request
