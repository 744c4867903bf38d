"""The chat page's head: its module graph preloaded, the early listener, the web app manifest."""

from __future__ import annotations

import re

import httpx
from django.templatetags.static import static

from chat.templatetags.modulepreload import imports_of, module_graph


def test_the_static_imports_are_read_and_dynamic_ones_and_strings_are_not():
    source = """import { a } from "./a.js";
import {
  b,
  c,
} from "./b.js";
import "../vendor/side-effect.js";
export { d } from "./d.js";
export const PENDING = ".math:not([data-typeset])";
const later = () => import("./lazy.js");
"""
    assert imports_of(source) == ["./a.js", "./b.js", "../vendor/side-effect.js", "./d.js"]


def test_the_chat_pages_graph_is_every_module_it_imports_but_not_what_it_loads_when_needed():
    graph = module_graph("chat/app.js")
    assert "chat/app.js" not in graph
    for path in ("chat/messages.js", "chat/render.js", "chat/markdown.js", "vendor/marked/marked.esm.js"):
        assert path in graph
    assert "vendor/katex/katex.min.js" not in graph  # fetched when math comes, or once the page is ready
    assert len(graph) == len(set(graph))


def test_the_chat_page_preloads_its_graph_listens_early_and_links_its_manifest(client, alice):
    client.force_login(alice)
    page = client.get("/").content.decode()
    preloaded = re.findall(r'<link rel="modulepreload" href="([^"]+)" fetchpriority="low">', page)
    assert preloaded == [static(path) for path in module_graph("chat/app.js")]
    assert all(re.search(r"\.[0-9a-f]{12}\.m?js$", href) for href in preloaded)  # the hashed files
    early = page.index(static("chat/early.js"))
    assert page.index("<body") > early  # listening before the message box exists
    assert '<link rel="manifest" href="/manifest.webmanifest">' in page
    assert 'id="send" aria-disabled="true"' in page


def test_the_manifest_is_public(client):
    response = client.get("/manifest.webmanifest")
    assert response.status_code == 200 and response["Content-Type"] == "application/manifest+json"
    assert response.json()["start_url"] == "/"


def test_favicon_ico_is_the_pages_icon_for_anyone(server):
    """A browser showing a document that names no icon (a JSON error) asks for /favicon.ico: a 404 before."""
    response = httpx.get(server.url + "/favicon.ico", follow_redirects=True)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("image/svg+xml")
    assert response.url.path == static("chat/favicon.svg") and response.history[0].status_code == 301
