"""/diagram-frame/: the sandboxed page in which Mermaid draws diagrams, under a policy of its own."""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.clickjacking import xframe_options_sameorigin
from django.views.decorators.http import require_GET

# Mermaid writes <style> elements and style attributes while it lays a diagram out, which the chat
# page's policy refuses. They are allowed here only: the page loads this into an iframe sandboxed
# without allow-same-origin (no cookies, storage or DOM of the site), where scripts come from this
# site alone (no inline script) and nothing else can be fetched or framed.
FRAME_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'self'",
    ]
)


@require_GET
@xframe_options_sameorigin
def diagram_frame(request):
    """The frame's page: Mermaid and diagram-frame.js, which draws what the chat page posts to it."""
    response = render(request, "chat/diagram_frame.html")
    response.headers["Content-Security-Policy"] = FRAME_POLICY
    return response
