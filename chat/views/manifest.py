"""/manifest.webmanifest: what a browser needs to install the chat as an app, opening on the chat; and
/favicon.ico, where browsers look for the icon of a document that names none.

Public (browsers fetch a manifest without cookies) and holding nothing private. There is no service
worker: answers and conversations live on the server, and no copy of them is kept offline.
"""

from __future__ import annotations

from django.http import HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

THEME = "#2563eb"  # --accent of static/chat/app.css, light


@require_GET
def web_manifest(request):
    icons = [
        {"src": static("chat/icons/icon-192.png"), "sizes": "192x192", "type": "image/png", "purpose": "any"},
        {"src": static("chat/icons/icon-512.png"), "sizes": "512x512", "type": "image/png", "purpose": "any"},
        {
            "src": static("chat/icons/icon-maskable-512.png"),
            "sizes": "512x512",
            "type": "image/png",
            "purpose": "maskable",
        },
    ]
    manifest = {
        "id": "/",
        "name": _("Team chat"),
        "short_name": _("Chat"),
        "description": _("Chat with your team's models."),
        "start_url": "/",
        "scope": "/",
        "display": "standalone",
        "background_color": "#ffffff",
        "theme_color": THEME,
        "icons": icons,
    }
    response = JsonResponse(manifest, content_type="application/manifest+json")
    response["Cache-Control"] = "public, max-age=3600"
    return response


@require_GET
def favicon(request):
    """The site's icon for what names none (a JSON error opened in a tab, a bookmark): the pages' own."""
    return HttpResponsePermanentRedirect(static("chat/favicon.svg"))
