"""Websocket routes, behind the overload guard, the Origin check and session authentication."""

from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from .consumers import ChatConsumer
from .overload import CachedAuthMiddlewareStack, ConnectGuard

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
]

# The guard comes first so that a refused connect costs no Origin check and no database read.
websocket_application = ConnectGuard(
    AllowedHostsOriginValidator(CachedAuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
)
