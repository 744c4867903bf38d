"""How long the chat page takes to be ready after its first paint, on a throttled link.

Starts the fake upstream and the real server (a fresh SQLite database, static files collected)
from a checkout, opens the chat page signed in, in Debian's Chromium with the cache off and
the link throttled through the DevTools protocol (Network.emulateNetworkConditions, with
DevTools' own presets), and prints, over --runs cold loads: the first contentful paint (the
composer is on the screen), ready (the page's scripts have wired the message box: the moment
its keydown listener is added, the same hook for any version of the page), the gap between
the two (what a person can type into a page that does not listen yet), the requests and bytes.

    .venv/bin/python bench/page_ready.py                      # Slow 3G, 5 runs, this checkout
    .venv/bin/python bench/page_ready.py --link 4g --runs 3
    .venv/bin/python bench/page_ready.py --root /tmp/older    # another checkout (before/after)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_bench import free_port, server_env, wait_http

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
# DevTools' presets (front_end/core/sdk/NetworkManager.ts): bytes a second and latency in ms.
LINKS = {
    "slow3g": {"download": 500 * 1000 / 8 * 0.8, "upload": 500 * 1000 / 8 * 0.8, "latency": 400 * 5},
    "fast3g": {"download": 1.6 * 1000 * 1000 / 8 * 0.9, "upload": 750 * 1000 / 8 * 0.9, "latency": 150 * 3.75},
    "4g": {"download": 9 * 1000 * 1000 / 8 * 0.9, "upload": 1.5 * 1000 * 1000 / 8 * 0.9, "latency": 60 * 2.75},
}
# Ready: the message box's keydown listener, whoever adds it (app.js wires it last of the composer).
READY_HOOK = """
(() => {
  const add = EventTarget.prototype.addEventListener;
  EventTarget.prototype.addEventListener = function (type, ...rest) {
    if (type === "keydown" && this instanceof HTMLElement && this.id === "input" && window.__ready === undefined) {
      window.__ready = performance.now();
    }
    return add.call(this, type, ...rest);
  };
})();
"""


class Stack:
    """The fake upstream and the server of the checkout at `root`, each in its own process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = tempfile.TemporaryDirectory(prefix="chat-page-bench-")
        fake_port, port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = server_env(f"sqlite:///{self.folder.name}/bench.sqlite3", fake_port)
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "collectstatic", "--noinput", "-v0"], cwd=root, env=self.env, check=True)
        subprocess.run([*manage, "migrate", "-v0"], cwd=root, env=self.env, check=True)
        script = (
            "from django.contrib.auth.models import User; from django.test import Client;"
            "u = User.objects.create_user('bench', password='x'); c = Client(); c.force_login(u);"
            "print(c.cookies['sessionid'].value)"
        )
        out = subprocess.run([*manage, "shell", "-c", script], cwd=root, env=self.env, check=True, capture_output=True)
        self.cookie = out.stdout.decode().split()[-1]
        self.fake = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "fakeupstream.app:app", "--port", str(fake_port), "--log-level",
             "warning"], cwd=root, env=self.env,
        )  # fmt: skip
        self.server = subprocess.Popen(
            [sys.executable, "-m", "chatsite.server", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
            cwd=root, env=self.env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{fake_port}/", self.fake)
        wait_http(self.url + "/accounts/login/", self.server)

    def close(self) -> None:
        for process in (self.server, self.fake):
            process.terminate()
            process.wait()
        self.folder.cleanup()


def load(browser, stack: Stack, link: dict | None) -> dict:
    """One cold load of the chat page: its paint, ready and transfer figures."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        context.add_cookies([{"name": "sessionid", "value": stack.cookie, "url": stack.url}])
        context.add_init_script(READY_HOOK)
        page = context.new_page()
        cdp = context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        if link:
            cdp.send(
                "Network.emulateNetworkConditions",
                {
                    "offline": False,
                    "latency": link["latency"],
                    "downloadThroughput": link["download"],
                    "uploadThroughput": link["upload"],
                },
            )
        sizes: dict[str, float] = {}
        cdp.on(
            "Network.loadingFinished", lambda event: sizes.__setitem__(event["requestId"], event["encodedDataLength"])
        )
        page.goto(stack.url + "/", timeout=300_000)
        page.wait_for_function("() => window.__ready !== undefined", timeout=300_000, polling=50)
        figures = page.evaluate(
            """() => ({
                paint: performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? null,
                ready: window.__ready,
                scripts: performance.getEntriesByType("resource").filter((e) => e.initiatorType === "script"
                    || e.initiatorType === "link" && /\\.m?js(\\?|$)/.test(e.name)).length,
            })"""
        )
        figures["requests"] = len(sizes)
        figures["kilobytes"] = sum(sizes.values()) / 1000
        return figures
    finally:
        context.close()


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.0f} ms (min {min(values):.0f}, max {max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the checkout")
    parser.add_argument("--link", choices=[*LINKS, "none"], default="slow3g")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    stack = Stack(args.root.resolve())
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            load(browser, stack, None)  # the server's first page (templates, catalogue) is not measured
            runs = [load(browser, stack, LINKS.get(args.link)) for _ in range(args.runs)]
            browser.close()
    finally:
        stack.close()
    print(f"{args.root.resolve()} on {args.link}, {args.runs} cold loads, medians:")
    print(f"  first contentful paint  {summary([run['paint'] for run in runs])}")
    print(f"  ready                   {summary([run['ready'] for run in runs])}")
    print(f"  ready after the paint   {summary([run['ready'] - run['paint'] for run in runs])}")
    print(f"  requests {statistics.median(run['requests'] for run in runs):.0f}, scripts "
          f"{statistics.median(run['scripts'] for run in runs):.0f}, "
          f"{statistics.median(run['kilobytes'] for run in runs):.0f} kB on the wire")  # fmt: skip


if __name__ == "__main__":
    main()
