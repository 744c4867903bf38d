"""Small polish in a real Chromium: figures in the page's language through Intl (one decimal separator on a
French page, "0,00 $US" not "$0.00"), and the theme switch of the settings (system, light, dark).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.page_helpers import open_chat, screenshot, send, wait_done

expect.set_options(timeout=15_000)


def brightness(page) -> int:
    background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    return sum(int(n) for n in re.findall(r"\d+", background)[:3])


def test_a_french_page_writes_numbers_money_and_shares_the_french_way(new_page, alice, providers):
    page = new_page(alice, locale="fr-FR")
    open_chat(page)
    budget = page.get_by_test_id("budget")
    expect(budget).to_contain_text(re.compile(r"0,00\s\$US dépensés"))  # not "$0.00 dépensés"
    reply = send(page, "[[chunks:8]] bonjour")
    wait_done(reply)
    usage = reply.locator(".usage")
    expect(usage).to_contain_text(re.compile(r"\d+,\d tok/s"))  # not "38.2 tok/s"
    assert not re.search(r"\d\.\d", usage.inner_text()), usage.inner_text()
    screenshot(page, "french-figures")
    # The usage dashboard: the server's figures written again in the page's language, one separator for all.
    page.goto("/usage/")
    table = page.locator("#models-table tbody tr").first
    expect(table).to_be_visible()
    cells = table.locator("td.num")
    expect(cells.nth(5)).to_have_text(re.compile(r"^\d[\d\s]*,\d$"))  # tokens per second, as "38,2"
    expect(cells.nth(6)).to_have_text(re.compile(r"^\d+,\d\s%$"))  # a share, as "0,0 %"
    expect(page.locator("#total-cost")).to_have_text(re.compile(r"^\d[\d\s]*,\d\d(\d\d)?\s\$US$"))
    figures = " ".join(page.locator("#models-table td.num, .usage-totals strong").all_inner_texts())
    assert not re.search(r"\d\.\d", figures), figures


@pytest.mark.parametrize(("system", "chosen"), [("light", "Dark"), ("dark", "Light")])
def test_the_theme_switch_overrides_the_system_and_system_follows_it_again(new_page, alice, providers, system, chosen):
    page = new_page(alice, color_scheme=system, viewport={"width": 1440, "height": 900})
    open_chat(page)
    dark_system = system == "dark"
    assert (brightness(page) < 180) == dark_system
    page.goto("/settings/")
    section = page.get_by_role("region", name="Theme")
    expect(section.get_by_label("As the system")).to_be_checked()
    section.get_by_label(chosen).check()
    assert (brightness(page) < 180) != dark_system  # at once, on the settings page itself
    screenshot(page, f"settings-theme-{chosen.lower()}")
    open_chat(page)
    assert (brightness(page) < 180) != dark_system  # and on every page after
    # The code's colours follow the theme too (highlight.js's stylesheet chosen by media).
    media = page.evaluate(
        "() => [...document.querySelectorAll('link[rel=stylesheet][href*=highlight]')]"
        ".map((link) => [link.href.includes('dark'), link.media])"
    )
    wanted_dark = not dark_system
    assert all((media_text != "not all") == (is_dark == wanted_dark) for is_dark, media_text in media), media
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", chosen.lower())
    page.goto("/settings/")
    page.get_by_role("region", name="Theme").get_by_label("As the system").check()
    open_chat(page)
    assert (brightness(page) < 180) == dark_system
