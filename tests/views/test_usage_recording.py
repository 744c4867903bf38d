"""A /v1 request's usage is recorded through a database outage longer than its response waits (metered_api)."""

from __future__ import annotations

import asyncio
import types

from django.db import OperationalError

from chat.views import metered_api


async def test_the_usage_is_retried_after_the_response_went_on_until_it_lands(monkeypatch, settings):
    settings.CHAT_FINAL_SAVE_SECONDS = 30
    monkeypatch.setattr(metered_api, "RECORD_FIRST_PAUSE", 0.01)
    monkeypatch.setattr(metered_api, "RECORD_LONGEST_PAUSE", 0.02)
    monkeypatch.setattr(metered_api, "RECORD_WAIT_SECONDS", 0.05)
    landed, down = asyncio.Event(), {"attempts": 0}

    def save(status: str, error: str, usage: dict) -> None:
        down["attempts"] += 1
        if down["attempts"] <= 8:  # the old three tries gave up here
            raise OperationalError("connection refused")
        landed.set()

    request = types.SimpleNamespace(recorded=False, state=types.SimpleNamespace(
        ended_at=None, metering=lambda chars, ended: {"completion_tokens": 3}), prompt_size=5,
        token=types.SimpleNamespace(user="carol"), _save=save)  # fmt: skip
    request._record = types.MethodType(metered_api.MeteredRequest._record, request)
    await metered_api.MeteredRequest.record(request, "complete", "")
    assert not landed.is_set()  # the response went on after its wait, the recording did not stop
    await asyncio.wait_for(landed.wait(), 10)
    assert down["attempts"] == 9


async def test_an_outage_longer_than_the_final_saves_gives_up_with_a_line(monkeypatch, settings, caplog):
    settings.CHAT_FINAL_SAVE_SECONDS = 0.1
    monkeypatch.setattr(metered_api, "RECORD_FIRST_PAUSE", 0.01)

    def save(status: str, error: str, usage: dict) -> None:
        raise OperationalError("connection refused")

    request = types.SimpleNamespace(token=types.SimpleNamespace(user="carol"), _save=save)
    await metered_api.MeteredRequest._record(request, "complete", "", {})
    assert "could not record API usage for carol, giving up after" in caplog.text
