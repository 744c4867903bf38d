"""Websocket routes, behind the Origin check and session authentication."""

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from django.urls import path

from .consumers import ChatConsumer
from .origins import OriginValidator

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
]

websocket_application = OriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
