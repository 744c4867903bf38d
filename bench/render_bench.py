"""The chat page's long tasks while a long answer with many sections streams, on a slow device.

Starts the fake upstream and the real server (bench/server_bench.py's Stack: a fresh SQLite database),
opens the chat page in Debian's headless Chromium with the CPU slowed down (CDP
Emulation.setCPUThrottlingRate, 4x by default) and has the fake stream back, four characters a
chunk, a 32 kB Markdown answer of many sections (headings, paragraphs with inline markup, lists,
code blocks, tables). A PerformanceObserver records every long task (over 50 ms) from the page's
first script until the answer's final render is in; the figures print as one JSON line a run.

    .venv/bin/python bench/render_bench.py                   # 4x slower CPU, 32 kB, 15 ms a chunk
    .venv/bin/python bench/render_bench.py --rate 1 --kb 64 --delay 5 --repeat 3

Targets (issue 37), with the CPU 4x slower: no long task over 100 ms, under 2 s of long tasks in all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from playwright.sync_api import sync_playwright
from server_bench import Stack

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]

WATCH = """
window.__tasks = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__tasks.push([entry.startTime, entry.duration]);
}).observe({ type: "longtask", buffered: true });
"""

# The last reply's status once it has ended and its final render is in (not aria-busy): woken by the
# page's own attribute changes, polling nothing (a poll would be a task on the measured main thread).
SETTLED = """() => new Promise((resolve) => {
    const reply = [...document.querySelectorAll("article.message.assistant")].at(-1);
    const settled = () => !["pending", "streaming"].includes(reply.dataset.status)
        && !reply.querySelector(".answer[aria-busy]");
    const observer = new MutationObserver(() => settled() && (observer.disconnect(), resolve(reply.dataset.status)));
    observer.observe(reply, { subtree: true, attributeFilter: ["data-status", "aria-busy"] });
    if (settled()) (observer.disconnect(), resolve(reply.dataset.status));
})"""

# The last frames drawn, then the long tasks so far.
TASKS = """() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(() =>
    setTimeout(() => resolve(window.__tasks), 200))))"""


BREAKDOWN = {"script": "ScriptDuration", "layout": "LayoutDuration", "style": "RecalcStyleDuration",
             "tasks": "TaskDuration"}  # fmt: skip


def metrics(cdp) -> dict[str, float]:
    return {metric["name"]: metric["value"] for metric in cdp.send("Performance.getMetrics")["metrics"]}


def sections(kb: int) -> str:
    """About `kb` kilobytes of Markdown in numbered sections, each with every common block."""
    parts, number = [], 0
    while sum(len(part) for part in parts) < kb * 1000:
        number += 1
        parts.append(
            f"## {number}. Section about the *deployment* step {number}\n\n"
            f"This step explains **why** the `worker-{number}` service restarts, with a "
            f"[link](https://example.com/{number}) and some more words to make the paragraph long enough "
            "to wrap over a few lines on a laptop screen.\n\n"
            f"- first point of section {number}, with `code`\n- second point, **bold**\n- third point\n\n"
            f"```python\ndef step_{number}(config):\n    for key, value in config.items():\n"
            f"        print(key, value * {number})\n    return {number}\n```\n\n"
            f"| setting | value | note |\n| --- | --- | --- |\n| retries | {number} | per minute |\n"
            f"| timeout | {number * 3} s | at most |\n\n"
        )
    return "".join(parts)


def collect_static() -> None:
    """The page's files as the server serves them (hashed, from STATIC_ROOT): this tree's, not an older copy."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=root, check=True)


def run(rate: float, kb: int, delay: int) -> dict:
    stack = Stack()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            context.add_cookies([{"name": "sessionid", "value": stack.cookie, "url": stack.url}])
            page = context.new_page()
            page.add_init_script(WATCH)
            page.goto(stack.url + "/")
            page.wait_for_selector("html[data-socket=open]")
            page.get_by_role("button", name="Settings").click()
            page.get_by_label("Max tokens").fill("30000")
            text = sections(kb)
            page.get_by_label("Message").fill(f"[[echo]] [[delay:{delay}]] {text}")
            cdp = page.context.new_cdp_session(page)
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": rate})
            cdp.send("Performance.enable")
            before = metrics(cdp)
            page.evaluate("() => { window.__tasks = []; window.__sent = performance.now(); }")
            started = time.monotonic()
            page.get_by_label("Message").press("Enter")
            page.wait_for_selector("article.message.assistant[data-status=streaming]")
            status = page.evaluate(SETTLED)
            seconds = time.monotonic() - started
            found = page.evaluate(TASKS)
            sent = page.evaluate("() => window.__sent")
            tasks = [duration for _, duration in found]
            after = metrics(cdp)
            chars = page.evaluate(
                "() => document.querySelector('article.message.assistant .answer').textContent.length"
            )
            browser.close()
    finally:
        stack.close()
    return {
        "cpu_slowdown": rate,
        "answer_kb": round(len(text) / 1000, 1),
        "status": status,
        "stream_s": round(seconds, 1),
        "long_tasks": len(tasks),
        "longest_ms": round(max(tasks, default=0)),
        "total_ms": round(sum(tasks)),
        "over_100ms": sum(1 for task in tasks if task > 100),
        # When the longest came, in seconds after the send (the stream's end is about stream_s).
        "longest_at_s": [
            [round((at - sent) / 1000, 1), round(duration)] for at, duration in sorted(found, key=lambda t: -t[1])[:3]
        ],
        "shown_chars": chars,
        # Where the main thread's time went meanwhile (Chromium's Performance.getMetrics), in seconds.
        **{f"{name}_s": round(after[key] - before[key], 1) for name, key in BREAKDOWN.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=4, help="CPU slowdown (Emulation.setCPUThrottlingRate)")
    parser.add_argument("--kb", type=int, default=32, help="the answer's size in kilobytes")
    parser.add_argument("--delay", type=int, default=15, help="milliseconds between the fake's chunks (4 characters)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    collect_static()
    for _ in range(args.repeat):
        print(json.dumps(run(args.rate, args.kb, args.delay)), flush=True)


if __name__ == "__main__":
    main()
