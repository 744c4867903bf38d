"""ASGI entry point: HTTP to Django (and the demo upstream under /_demo/), websockets to chat."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup(set_prefix=False)  # as get_asgi_application() does, before its handler

from chatsite.middleware import ASGIHandler  # noqa: E402  (needs the apps loaded)

django_http = ASGIHandler()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs the apps loaded)
from django.conf import settings  # noqa: E402

from chat.apps import prepare_to_serve  # noqa: E402
from chat.ws.routing import websocket_application  # noqa: E402


def with_demo_upstream(app):
    """Serve the built-in fake upstream at /_demo/ beside Django, for installs without a real one."""
    from chat.models import demo_api_key
    from fakeupstream.app import FakeUpstream
    from fakeupstream.directives import DEMO_CAPS

    # It runs in the server's own process: bounded directives and a small request log.
    demo = FakeUpstream(api_key=demo_api_key(), delay=0.03, max_records=20, caps=DEMO_CAPS, keep_bytes=False)

    async def router(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/_demo/"):
            return await demo(scope, receive, send)
        return await app(scope, receive, send)

    return router


def with_probes(app):
    """/healthz, /readyz and /metrics before Django: no middleware, no session, no access log (chat/views/probes.py)."""
    from chat.views import probes

    async def router(scope, receive, send):
        if scope["type"] == "http" and scope["path"] in probes.PATHS:
            return await probes.app(scope, receive, send)
        return await app(scope, receive, send)

    return router


prepare_to_serve()

application = ProtocolTypeRouter(
    {
        "http": with_probes(with_demo_upstream(django_http) if settings.DEMO_UPSTREAM else django_http),
        "websocket": websocket_application,
    }
)
