"""What chat/compat/channels.py relies on in Channels still holds: these fail when an upgrade changes it."""

from __future__ import annotations

import inspect

from channels.auth import AuthMiddleware, UserLazyObject, get_user
from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import InMemoryChannelLayer
from channels.sessions import InstanceSessionWrapper, SessionMiddleware
from channels.utils import await_many_dispatch

from chat.compat.channels import InMemoryLayer, LeanJsonWebsocketConsumer, get_user_sync, set_scope_user
from tests.upstream_source import assert_unchanged

RELIED_ON_BY = "chat/compat/channels.py"


def test_the_consumers_call_dispatch_and_disconnect_are_the_ones_copied():
    # LeanJsonWebsocketConsumer's three are Channels' with dispatch_all and without closing connections.
    assert_unchanged(AsyncConsumer.__call__, "e52238720872dbc3", RELIED_ON_BY)
    assert_unchanged(await_many_dispatch, "30ef889498560da3", RELIED_ON_BY)
    assert_unchanged(AsyncConsumer.dispatch, "39f34e7d4fb0f655", RELIED_ON_BY)
    assert_unchanged(AsyncWebsocketConsumer.websocket_disconnect, "10f38aa55fd51ff5", RELIED_ON_BY)


def test_fast_events_find_their_handlers_by_channels_naming_rule():
    from chat.ws.consumer import ChatConsumer

    assert_unchanged(get_handler_name, "c88c7b7d8763fb61", RELIED_ON_BY)
    assert get_handler_name({"type": "chat.delta"}) == "chat_delta"
    assert set(ChatConsumer.fast_handlers) == set(ChatConsumer.fast_events) == {"chat.started", "chat.delta",
                                                                                 "chat.snapshot"}  # fmt: skip
    for kind, handler in ChatConsumer.fast_handlers.items():
        assert handler is getattr(ChatConsumer, get_handler_name({"type": kind}))


async def test_a_fast_event_and_a_looked_up_one_reach_the_same_handlers():
    seen = []

    class Consumer(LeanJsonWebsocketConsumer):
        fast_events = ("chat.delta",)

        async def chat_delta(self, event):
            seen.append(("fast", event["n"]))

        async def chat_done(self, event):
            seen.append(("looked up", event["n"]))

    consumer = Consumer()
    await consumer.dispatch({"type": "chat.delta", "n": 1})
    await consumer.dispatch({"type": "chat.done", "n": 2})
    assert seen == [("fast", 1), ("looked up", 2)]


async def test_the_session_wrapper_hands_the_consumer_its_bound_send_around_real_send():
    assert_unchanged(SessionMiddleware.__call__, "bc50432963de2e44", RELIED_ON_BY)
    assert_unchanged(InstanceSessionWrapper.__init__, "1aed8029d4065532", RELIED_ON_BY)
    assert_unchanged(InstanceSessionWrapper.send, "e951315e4ef0f195", RELIED_ON_BY)
    sent = []

    async def send(message):
        sent.append(message)

    wrapper = InstanceSessionWrapper({"type": "websocket", "cookies": {}}, send)
    assert wrapper.send.__self__ is wrapper and wrapper.real_send is send
    assert wrapper.save_message_types == ["http.response.start"]


async def test_the_lean_consumer_sends_frames_past_the_session_wrapper():
    class Consumer(LeanJsonWebsocketConsumer):
        async def websocket_connect(self, message):
            raise StopConsumer()  # done once __call__ has set frame_send

    async def send(message):
        pass

    async def receive():
        return {"type": "websocket.connect"}

    wrapper = InstanceSessionWrapper({"type": "websocket", "cookies": {}}, send)
    consumer = Consumer()
    consumer.channel_layer_alias = "none configured"  # no layer: only the socket is read
    await consumer({"type": "websocket"}, receive, wrapper.send)
    assert consumer.frame_send is send and consumer.base_send == wrapper.send


async def test_the_scopes_lazy_user_is_filled_through_wrapped():
    assert_unchanged(AuthMiddleware.populate_scope, "5d41fdc0d5793fd9", RELIED_ON_BY)
    assert_unchanged(AuthMiddleware.resolve_scope, "e4d45bbcc94f96a2", RELIED_ON_BY)
    assert_unchanged(AuthMiddleware.__call__, "f3eba6fe6a0c9c36", RELIED_ON_BY)
    scope = {"session": {}}
    AuthMiddleware(None).populate_scope(scope)
    assert isinstance(scope["user"], UserLazyObject)
    user = type("User", (), {"pk": 7})()
    set_scope_user(scope, user)
    assert scope["user"].pk == 7


def test_get_user_is_a_wrapper_around_a_plain_function():
    assert get_user_sync is get_user.func
    assert not inspect.iscoroutinefunction(get_user_sync) and list(inspect.signature(get_user_sync).parameters) == [
        "scope"
    ]


# --- the in-memory layer ----------------------------------------------------------------


def test_the_in_memory_layers_storage_is_the_one_reached():
    assert_unchanged(InMemoryChannelLayer.__init__, "a868dc26b1c1947d", RELIED_ON_BY)
    assert_unchanged(InMemoryChannelLayer.send, "a4dab1cd8aff886e", RELIED_ON_BY)
    assert_unchanged(InMemoryChannelLayer.receive, "e615f8ae40b60e12", RELIED_ON_BY)
    assert_unchanged(InMemoryChannelLayer._clean_expired, "604032dae1cc01d2", RELIED_ON_BY)
    assert_unchanged(InMemoryChannelLayer.group_send, "693c3172deb6431b", RELIED_ON_BY)
    assert_unchanged(InMemoryChannelLayer.group_add, "7c4f2ffd2d8f7a91", RELIED_ON_BY)


async def test_what_the_layer_puts_channels_own_receive_reads_and_its_groups_are_read_back():
    layer = InMemoryLayer(capacity=2)
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "x"})
    expires, message = layer.channels[channel]._queue[0]  # Channels' own (expiry, message) entries
    assert isinstance(expires, float) and message == {"type": "x"}
    assert await InMemoryChannelLayer.receive(layer, channel) == {"type": "x"}
    await layer.group_add("g", channel)
    assert await layer.group_members("g") == [channel]


async def test_expiry_is_looked_for_at_most_every_clean_every_seconds():
    layer = InMemoryLayer(expiry=0)
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "stale"})
    layer._clean_expired()  # clean_every 0, Channels' own: every time
    assert channel not in layer.channels
    layer.clean_every = 3600
    await layer.send(channel, {"type": "stale too"})
    layer._clean_expired()  # within clean_every of the last scan: none
    assert channel in layer.channels
