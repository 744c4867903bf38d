"""Prompt presets with "/" in the composer, personal defaults and model-written titles, in Chromium
against the real server."""

from __future__ import annotations

import re

from django.db import connection
from playwright.sync_api import expect

from chat.models import Conversation, PromptPreset
from tests.live import LiveServer, database_url
from tests.page.test_a11y import violations
from tests.page_helpers import API14_MINI, I14, open_chat, screenshot, send, wait_done

expect.set_options(timeout=15_000)


def test_slash_lists_the_presets_filters_as_typed_and_one_chosen_applies_to_the_new_chat(
    page, alice, bob, django_user_model, fake
):
    PromptPreset.objects.create(
        owner=alice, name="Code review", text="Review this code: [[chunks:2]]", system_prompt="You are strict.",
        model=API14_MINI, params={"temperature": 0.2, "top_p": 0.5},
    )  # fmt: skip
    PromptPreset.objects.create(owner=alice, name="Translate", text="Translate into French:")
    carol = django_user_model.objects.create_user("carol", password="carol-secret-pw", is_staff=True)
    PromptPreset.objects.create(owner=carol, name="Team tone", text="Write kindly.", published=True)
    PromptPreset.objects.create(owner=bob, name="Bob's secret", text="Not for Alice.")
    box = page.get_by_label("Message")
    menu = page.get_by_role("listbox", name="Prompt presets")
    options = menu.get_by_role("option")

    box.press("/")
    expect(options).to_have_count(3)
    expect(options.locator(".preset-name")).to_have_text(["Code review", "Team tone", "Translate"])
    expect(options.nth(1)).to_contain_text("shared")  # published by staff, read-only here
    screenshot(page, "presets")
    assert violations(page) == []
    box.press_sequentially("tr")
    expect(options).to_have_count(1)
    expect(options).to_have_text(re.compile("^Translate"))
    box.press("Escape")  # closes the list; the text stays and nothing is sent
    expect(menu).to_be_hidden()
    expect(box).to_have_value("/tr")
    box.press_sequentially("zz")
    expect(options).to_have_count(0)
    expect(menu).to_contain_text("No preset matches.")

    box.fill("")
    box.press("/")
    expect(options).to_have_count(3)
    expect(options.first).to_have_attribute("aria-selected", "true")
    box.press("ArrowUp")  # wraps to the last
    expect(options.last).to_have_attribute("aria-selected", "true")
    box.press("ArrowDown")
    expect(options.first).to_have_attribute("aria-selected", "true")
    expect(box).to_have_attribute("aria-activedescendant", options.first.get_attribute("id"))
    box.press("Enter")  # chooses, does not send
    expect(menu).to_be_hidden()
    expect(box).to_have_value("Review this code: [[chunks:2]]")
    expect(page.locator("article.message")).to_have_count(0)
    expect(page.get_by_label("Model")).to_have_value(API14_MINI)
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_label("Temperature")).to_have_value("0.2")
    expect(page.get_by_label("System prompt")).to_have_value("You are strict.")

    box.press_sequentially(" def f(): pass")
    wait_done(send_typed(page))
    body = fake.app.last().body
    assert body["model"] == "openai/gpt-5-mini" and body["temperature"] == 0.2 and body["top_p"] == 0.5
    assert body["messages"] == [
        {"role": "system", "content": "You are strict."},
        {"role": "user", "content": "Review this code: [[chunks:2]] def f(): pass"},
    ]


def send_typed(page):
    """Send what the box holds (Enter) and return the reply's article once it exists."""
    page.get_by_label("Message").press("Enter")
    reply = page.locator("article.message.assistant").last
    expect(reply).to_have_attribute("data-message-id", re.compile(r"^\d+$"))
    return reply


def test_defaults_and_presets_set_on_the_settings_page_are_used_by_every_new_chat(new_page, alice, providers, fake):
    page = new_page(alice)
    page.goto("/settings/")
    defaults = page.get_by_test_id("defaults-section")
    expect(defaults.locator(f'option[value="{API14_MINI}"]')).to_be_attached()
    defaults.get_by_label("Model").select_option(API14_MINI)
    defaults.get_by_label("Temperature").fill("0.4")
    defaults.get_by_label("System prompt").fill("Answer in French.")
    defaults.get_by_role("button", name="Save defaults").click()
    expect(defaults.get_by_role("status")).to_have_text("Saved.")
    assert violations(page) == []

    presets = page.get_by_test_id("presets-section")
    presets.get_by_label("Name").fill("Haiku")
    presets.get_by_label("Text to insert").fill("Write a haiku about [[chunks:2]]")
    presets.get_by_label("Temperature (optional)").fill("1.5")
    presets.get_by_role("button", name="Add preset").click()
    expect(presets.locator("#preset-list li")).to_have_count(1)
    expect(presets.locator("#preset-list li")).to_contain_text("Haiku")
    page.get_by_role("heading", name="Prompt presets").evaluate("heading => heading.scrollIntoView()")
    screenshot(page, "settings-presets")
    assert PromptPreset.objects.get(owner=alice).params == {"temperature": 1.5}

    open_chat(page)
    expect(page.get_by_label("Model")).to_have_value(API14_MINI)
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_label("Temperature")).to_have_value("0.4")
    expect(page.get_by_label("System prompt")).to_have_value("Answer in French.")
    wait_done(send(page, "[[chunks:2]] Hello"))
    body = fake.app.last().body
    assert body["model"] == "openai/gpt-5-mini" and body["temperature"] == 0.4
    assert body["messages"][0] == {"role": "system", "content": "Answer in French."}

    # A new chat starts from them again; what is cleared in its panel is not put back by the server.
    page.keyboard.press("Control+Shift+O")
    expect(page.get_by_label("System prompt")).to_have_value("Answer in French.")
    page.get_by_label("System prompt").fill("")
    page.get_by_label("Temperature").fill("")
    page.get_by_label("Model").select_option(I14)
    wait_done(send(page, "[[chunks:2]] Bonjour"))
    body = fake.app.last().body
    assert body["model"] != "openai/gpt-5-mini" and "temperature" not in body
    assert body["messages"] == [{"role": "user", "content": "[[chunks:2]] Bonjour"}]

    # The preset made on the settings page is offered under "/" and applies its temperature.
    page.keyboard.press("Control+Shift+O")
    box = page.get_by_label("Message")
    box.press_sequentially("/hai")
    expect(page.get_by_role("listbox", name="Prompt presets").get_by_role("option")).to_have_text(re.compile("^Haiku"))
    box.press("Enter")
    expect(box).to_have_value("Write a haiku about [[chunks:2]]")
    expect(page.get_by_label("Temperature")).to_have_value("1.5")
    wait_done(send_typed(page))
    assert fake.app.last().body["temperature"] == 1.5


def test_the_title_a_model_writes_replaces_the_first_line_on_the_page(new_page, alice, providers):
    env = {"DATABASE_URL": database_url(connection.settings_dict), "CHAT_TITLES": "1", "DJANGO_ALLOW_ASYNC_UNSAFE": ""}
    with LiveServer(env) as live:
        page = new_page(alice, url=live.url)
        open_chat(page)
        wait_done(send(page, "[[chunks:2]] Plan a trip to Lyon"))
        # The fake answers the title request with its default text, whose first line starts so.
        written = re.compile(r"^Hi! This reply comes from the demo upstream \(i14, model")
        expect(page.locator("#chat-title")).to_have_text(written)
        expect(page.locator("#conversation-list li a")).to_have_text([written])
        assert written.match(Conversation.objects.get(owner=alice).title)
