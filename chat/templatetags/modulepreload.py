"""`{% modulepreload "chat/app.js" %}`: a `<link rel="modulepreload">` for every module the entry imports.

A browser finds a module's imports only once it has the module, one round trip per level of the
graph (five on the chat page); listed in the page's head, all of them are fetched at once, at a low
priority so that the stylesheets and early.js, which the first paint waits for, come first. The
graph is read from the static sources (static `import … from "…"` and `export … from "…"` only:
a dynamic `import()` is loaded when needed), once per process.
"""

from __future__ import annotations

import functools
import posixpath
import re

from django import template
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.utils.html import format_html_join

register = template.Library()

STATIC_IMPORT = re.compile(
    r"""^\s*(?:import\s*["']([^"']+)["']|(?:import|export)\b[^;'"()]*?\bfrom\s*["']([^"']+)["'])""", re.MULTILINE
)


def imports_of(source: str) -> list[str]:
    """The specifiers of a module's static imports, in order."""
    return [bare or named for bare, named in STATIC_IMPORT.findall(source)]


@functools.cache
def module_graph(entry: str) -> tuple[str, ...]:
    """Every static path the module at `entry` imports, directly or not (not the entry itself)."""
    seen: dict[str, None] = {}
    pending = [entry]
    while pending:
        path = pending.pop(0)
        found = finders.find(path)
        if not found:
            continue
        with open(found, encoding="utf-8") as file:
            source = file.read()
        for specifier in imports_of(source):
            if not specifier.startswith("."):
                continue  # a bare or absolute specifier is not ours to preload
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), specifier))
            if target != entry and target not in seen and finders.find(target):
                seen[target] = None
                pending.append(target)
    return tuple(seen)


@register.simple_tag
def modulepreload(entry: str) -> str:
    return format_html_join(
        "\n  ",
        '<link rel="modulepreload" href="{}" fetchpriority="low">',
        ((static(path),) for path in module_graph(entry)),
    )
