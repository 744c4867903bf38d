"""Websocket routes, behind the overload guard, the Origin check and session authentication."""

from channels.routing import URLRouter
from django.urls import path

from chat.ws.consumer import ChatConsumer
from chat.ws.origins import OriginValidator
from chat.ws.overload import CachedAuthMiddlewareStack, ConnectGuard

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
]

# The guard comes first so that a refused connect costs no Origin check and no database read.
websocket_application = ConnectGuard(OriginValidator(CachedAuthMiddlewareStack(URLRouter(websocket_urlpatterns))))
