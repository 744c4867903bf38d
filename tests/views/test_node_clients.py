"""/v1 with the real Node clients (tests/node/, installed by tests/prepare.sh): openai-node and the AI SDK.

One node process per client and dialect runs that client's scenarios (tests/node/*.mjs) against
the real server on the fake upstream, and prints their results as one JSON line: two turns and
a two-step tool loop with a reasoning model, streaming and not.
"""

import json
import os
import shutil
import subprocess

import pytest

from chat.models import ApiToken, Usage
from tests.conftest import DIALECTS
from tests.live import ROOT

# slow: a node process each (its start and imports) and eight requests through the server.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NODE = ROOT / "tests" / "node"
# A reasoning model per dialect (the scripts add [[reasoning:3]], so infyrence's thinks too).
REASONING = {
    "i14": "i14-sugarglider-nemotron3-super-120B-v1",
    "api14": "deepseek/deepseek-r1",
    "infyrence": "claude-sonnet-5",
}
TWO_TURNS = ["first question", "second question"]
TOOL_TEXT = "Tool results: sunny in Paris; sunny in Tokyo"


@pytest.fixture
def token(alice):
    return ApiToken.issue(alice, "node")[1]


def run_node(script: str, server, token: str, model: str, **env: str) -> dict:
    """The scenarios' results, by name, from one run of tests/node/<script>."""
    if shutil.which("node") is None or not (NODE / "node_modules").is_dir():
        pytest.fail("Node and tests/node/node_modules are needed: tests/prepare.sh installs them (make test)")
    done = subprocess.run(
        ["node", script],
        cwd=NODE,
        env={**os.environ, "API_BASE_URL": server.url + "/v1", "API_TOKEN": token, "API_MODEL": model, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def failed(results: dict) -> str:
    """The failed scenarios, one a line with the client's error (empty if none failed)."""
    return "\n".join(f"{name}: {r['status']} {r['error']}" for name, r in results.items() if not r["ok"])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_openai_node_chat_completions_two_turns_and_tool_loops(server, token, providers, fake, dialect):
    """create() and .stream()/finalChatCompletion(), each reply appended as the SDK gives it (its reasoning too)."""
    results = run_node("openai_chat.mjs", server, token, REASONING[dialect])
    assert not failed(results), failed(results)
    for suffix in ("", "_stream"):
        assert results[f"two_turns{suffix}"]["texts"] == TWO_TURNS
        loop = results[f"tool_loop{suffix}"]
        assert loop["finish"] == "tool_calls" and loop["calls"] == ["get_weather", "get_weather"]
        assert loop["text"] == TOOL_TEXT
    assert results["two_turns_stream"]["usage"]["completion_tokens"] > 0
    assert Usage.objects.filter(status="complete").count() == 8  # one row per upstream request


@pytest.mark.parametrize("dialect", DIALECTS)
def test_openai_node_responses_create_and_stream(server, token, providers, fake, dialect):
    results = run_node("openai_responses.mjs", server, token, REASONING[dialect])
    assert not failed(results), failed(results)
    for suffix in ("", "_stream"):
        turns = results[f"two_turns{suffix}"]
        assert turns["texts"] == TWO_TURNS and turns["reasoning"] and all(turns["reasoning"]), results
        assert turns["usage"]["output_tokens"] > 0
        assert results[f"tool_loop{suffix}"] == {"ok": True, "calls": ["get_weather"] * 2, "text": TOOL_TEXT}
    # The follow-ups sent only their new input; the server brought the history back without reasoning.
    messages = fake.app.last().body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert not any("reasoning" in m or "reasoning_content" in m for m in messages)
    assert Usage.objects.filter(status="complete").count() == 8


@pytest.mark.parametrize("provider", ["compatible", "responses"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_ai_sdk_two_turns_and_multi_step_tools(server, token, providers, fake, dialect, provider):
    """@ai-sdk/openai-compatible (chat completions) and @ai-sdk/openai's default Responses model."""
    results = run_node("ai_sdk.mjs", server, token, REASONING[dialect], API_PROVIDER=provider)
    assert not failed(results), failed(results)
    for name in ("two_turns", "two_turns_stream"):
        assert results[name]["texts"] == TWO_TURNS, name
        assert results[name]["reasoning"], name  # the upstream's reasoning reached the SDK as reasoning
        assert results[name]["usage"]["outputTokens"] > 0, name
    for name in ("tool_loop", "tool_loop_stream"):
        loop = results[name]
        assert loop["steps"] == 2 and loop["calls"] == ["get_weather"] * 2 and loop["text"] == TOOL_TEXT, name
    assert Usage.objects.filter(status="complete").count() == 8
