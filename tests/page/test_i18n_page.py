"""The page in French for a French browser (real Chromium, real server); the settings switch goes back to English."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.page_helpers import open_chat, screenshot, send, wait_done

expect.set_options(timeout=15_000)


def test_a_french_browser_gets_the_chat_its_answers_errors_and_settings_in_french(new_page, alice, providers):
    page = new_page(alice, locale="fr-FR")
    open_chat(page)
    expect(page.locator("html")).to_have_attribute("lang", "fr")
    expect(page).to_have_title("Nouvelle conversation · Chat d’équipe")  # set by the script, from the catalogue
    expect(page.get_by_role("button", name="Nouvelle conversation", exact=True)).to_be_visible()
    expect(page.get_by_role("heading", name="Comment puis-je vous aider ?")).to_be_visible()
    expect(page.get_by_role("link", name="Paramètres")).to_be_visible()

    # A sent message's controls and its usage line, written by the page's modules.
    reply = send(page, "[[chunks:3]] bonjour")
    wait_done(reply)
    expect(reply).to_have_attribute("aria-label", re.compile(r"^Réponse de "))
    expect(reply.get_by_role("button", name="Copier la réponse")).to_be_visible()
    expect(reply.get_by_role("button", name="Régénérer")).to_be_visible()
    expect(reply.locator(".usage")).to_contain_text("en sortie")
    expect(page.locator("article.message.user").last.get_by_role("button", name="Modifier")).to_be_attached()
    screenshot(page, "french")

    # An upstream failure, worded by the server in the socket's language.
    failed = send(page, "[[status:500]] échec")
    wait_done(failed, "failed")
    expect(failed.locator(".message-error")).to_contain_text("Le fournisseur a refusé la requête (500")
    expect(failed.locator(".message-status")).to_have_text("Échouée")

    # An error notice from the page itself.
    box = page.get_by_label("Message")
    box.fill("x" * 100_001)
    box.press("Enter")
    expect(page.locator("#notice-text")).to_contain_text("Le message est trop long (plus de 100")

    # The settings page, then its switch back to English, which the chat page follows.
    page.goto("/settings/")
    expect(page.get_by_role("heading", name="Paramètres", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="Retour au chat")).to_be_visible()
    expect(page.get_by_label("Langue des pages")).to_have_value("fr")
    screenshot(page, "settings-french")
    page.get_by_label("Langue des pages").select_option("en")
    page.get_by_role("button", name="Utiliser cette langue").click()
    expect(page.get_by_role("heading", name="Settings", exact=True)).to_be_visible()
    expect(page.get_by_label("Language of the pages")).to_have_value("en")
    expect(page.locator("html")).to_have_attribute("lang", "en")
    open_chat(page)
    expect(page.get_by_role("button", name="New chat", exact=True)).to_be_visible()
    expect(page.get_by_role("heading", name="What can I help with?")).to_be_visible()
