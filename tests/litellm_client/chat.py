"""litellm as a client of /v1: two turns and a two-step tool loop, streaming and not, on one model.

Run by tests/views/test_litellm_client.py with bench/.venv's Python (litellm is locked in
bench/requirements.lock, never in the tests' lock): API_BASE_URL, API_TOKEN and API_MODEL come
from the environment; one JSON line of results, one entry per scenario, goes to stdout. Each
reply is appended to the history as litellm gives it (`choices[0].message`, its
`reasoning_content`, `provider_specific_fields` and the rest), as litellm's own examples do.
"""

import json
import os
import sys

import litellm

BASE = os.environ["API_BASE_URL"]
TOKEN = os.environ["API_TOKEN"]
MODEL = "openai/" + os.environ["API_MODEL"]
# [[reasoning:3]]: the fake upstream thinks first on every dialect; [[echo]]: it answers with the text.
THINK = "[[reasoning:3]] "
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def ask(stream: bool, messages: list, **extra):
    """One completion; streamed ones are litellm's chunks put together by litellm.stream_chunk_builder."""
    common = {"model": MODEL, "api_base": BASE, "api_key": TOKEN, "messages": messages, "timeout": 30, **extra}
    if not stream:
        return litellm.completion(**common), None
    chunks = list(litellm.completion(**common, stream=True, stream_options={"include_usage": True}))
    deltas = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    return litellm.stream_chunk_builder(chunks, messages=messages), deltas


def sent_back(message) -> list[str]:
    """The fields of a reply as litellm hands it back, the ones that are set."""
    return sorted(key for key, value in message.model_dump().items() if value is not None)


def two_turns(stream: bool) -> dict:
    messages = [{"role": "user", "content": THINK + "[[echo]] first question"}]
    first, first_deltas = ask(stream, messages)
    reply = first.choices[0].message
    messages += [reply, {"role": "user", "content": THINK + "[[echo]] second question"}]
    second, _ = ask(stream, messages)
    return {
        "texts": [reply.content, second.choices[0].message.content],
        "reasoning": getattr(reply, "reasoning_content", None),
        "sent_back": sent_back(reply),
        "deltas": first_deltas,
        "usage": second.usage.model_dump() if second.usage else None,
    }


def tool_loop(stream: bool) -> dict:
    messages = [{"role": "user", "content": THINK + "[[tools]] What is the weather in Paris and Tokyo?"}]
    first, _ = ask(stream, messages, tools=TOOLS)
    reply = first.choices[0].message
    messages.append(reply)
    for call in reply.tool_calls or []:
        city = json.loads(call.function.arguments)["city"]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"sunny in {city}"})
    second, _ = ask(stream, messages, tools=TOOLS)
    return {
        "finish": first.choices[0].finish_reason,
        "calls": [call.function.name for call in reply.tool_calls or []],
        "reasoning": getattr(reply, "reasoning_content", None),
        "sent_back": sent_back(reply),
        "text": second.choices[0].message.content,
    }


def main() -> None:
    results = {}
    for stream in (False, True):
        suffix = "_stream" if stream else ""
        for name, run in (("two_turns", two_turns), ("tool_loop", tool_loop)):
            try:
                results[name + suffix] = {"ok": True, **run(stream)}
            except Exception as error:  # recorded with litellm's message; the next scenario still runs
                status = getattr(error, "status_code", None)
                results[name + suffix] = {"ok": False, "error": f"{type(error).__name__}: {error}", "status": status}
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
