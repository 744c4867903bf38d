"""The single-process channel layer keeps Channels' in-memory semantics."""

import pytest
from channels.exceptions import ChannelFull

from chat.layers import LocalChannelLayer


async def test_group_send_reaches_every_member_once_with_its_own_copy():
    layer = LocalChannelLayer(capacity=10)
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("g", a)
    await layer.group_add("g", b)
    message = {"type": "chat.delta", "text": "hi"}
    await layer.group_send("g", message)
    got_a, got_b = await layer.receive(a), await layer.receive(b)
    assert got_a == got_b == message and got_a is not message and got_a is not got_b
    await layer.group_discard("g", b)
    await layer.group_send("g", {"type": "x"})
    assert (await layer.receive(a))["type"] == "x" and b not in layer.channels


async def test_a_full_member_misses_a_group_message_and_others_still_get_it():
    layer = LocalChannelLayer(capacity=1)
    full, fine = await layer.new_channel(), await layer.new_channel()
    await layer.send(full, {"type": "first"})
    with pytest.raises(ChannelFull):
        await layer.send(full, {"type": "second"})
    await layer.group_add("g", full)
    await layer.group_add("g", fine)
    await layer.group_send("g", {"type": "to all"})
    assert (await layer.receive(fine))["type"] == "to all"
    assert (await layer.receive(full))["type"] == "first"


async def test_expired_messages_are_dropped(monkeypatch):
    layer = LocalChannelLayer(expiry=0)
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    await layer.send(channel, {"type": "stale"})
    monkeypatch.setattr("chat.layers.CLEAN_EVERY", 0)
    layer._clean_expired()
    assert channel not in layer.channels and channel not in layer.groups.get("g", {})
