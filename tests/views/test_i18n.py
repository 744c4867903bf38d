"""English and French: complete, compiled catalogues; pages, errors and the socket in the browser's language."""

from __future__ import annotations

import ast
import gettext
import re
import shutil

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.core.management import call_command
from django.test import Client

from tests.conftest import MODELS, session_cookie

FRENCH = settings.BASE_DIR / "locale" / "fr" / "LC_MESSAGES"
DOMAINS = ["django", "djangojs"]
# As README's "Translations" section runs makemessages.
IGNORE = [".venv", "bench", "tests", "static/vendor", "staticfiles", "deploy", "docs"]
# What makemessages reads: the code, the templates and the page's scripts (every folder of static/ but vendor/).
SCRIPTS = sorted(
    f"static/{folder.name}"
    for folder in (settings.BASE_DIR / "static").iterdir()
    if folder.is_dir() and folder.name != "vendor"
)
SOURCES = ["chat", "chatsite", "templates", *SCRIPTS]
PLACEHOLDER = re.compile(r"%\([a-z_]+\)[sdr]")


def read_po(path) -> dict[str, dict]:
    """msgid -> {plural, strings, fuzzy}; the header and obsolete (#~) entries left out."""
    entries: dict[str, dict] = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [line for line in block.strip().splitlines() if not line.startswith("#~")]
        if not any(line.startswith("msgid ") for line in lines):
            continue
        entry = {"msgid": "", "plural": None, "strings": {}, "fuzzy": False}
        field = None
        for line in lines:
            if line.startswith("#,"):
                entry["fuzzy"] |= "fuzzy" in line
            elif line.startswith("#"):
                continue
            elif line.startswith("msgid_plural "):
                field, entry["plural"] = "plural", ast.literal_eval(line[13:])
            elif line.startswith("msgid "):
                field, entry["msgid"] = "msgid", ast.literal_eval(line[6:])
            elif line.startswith("msgstr"):
                index = int(line[7]) if line.startswith("msgstr[") else 0
                field = index
                entry["strings"][index] = ast.literal_eval(line.split(" ", 1)[1])
            elif line.startswith('"'):
                if isinstance(field, int):
                    entry["strings"][field] += ast.literal_eval(line)
                else:
                    entry[field] += ast.literal_eval(line)
        if entry["msgid"]:
            entries[entry["msgid"]] = entry
    return entries


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_string_of_the_code_and_scripts_is_in_the_french_catalogue(domain, tmp_path, settings, monkeypatch):
    assert shutil.which("xgettext"), "makemessages needs GNU gettext (tests/prepare.sh installs it)"
    # makemessages writes next to the sources it reads: it reads a copy here, so the repo's catalogues stay as they are.
    source = tmp_path / "source"
    for part in SOURCES:
        shutil.copytree(settings.BASE_DIR / part, source / part, ignore=shutil.ignore_patterns("vendor", "__pycache__"))
    (source / "locale").mkdir()
    settings.LOCALE_PATHS = [source / "locale"]
    monkeypatch.chdir(source)
    call_command("makemessages", locale=["fr"], domain=domain, ignore_patterns=IGNORE, no_location=True, verbosity=0)
    extracted = set(read_po(source / "locale" / "fr" / "LC_MESSAGES" / f"{domain}.po"))
    committed = set(read_po(FRENCH / f"{domain}.po"))
    assert "New chat" in extracted  # the page's t("…") calls and the templates are both read
    assert not extracted - committed, f"not in locale/fr/{domain}.po (run makemessages, see README)"
    assert not committed - extracted, f"no longer used, still in locale/fr/{domain}.po"


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_french_message_is_translated_with_the_same_placeholders(domain):
    for msgid, entry in read_po(FRENCH / f"{domain}.po").items():
        assert not entry["fuzzy"], msgid
        expected = 2 if entry["plural"] else 1
        assert len(entry["strings"]) == expected and all(entry["strings"].values()), f"untranslated: {msgid!r}"
        for source in filter(None, [msgid, entry["plural"]]):
            for translated in entry["strings"].values():
                assert set(PLACEHOLDER.findall(translated)) == set(PLACEHOLDER.findall(source)), msgid


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_compiled_catalogue_matches_its_po_file(domain):
    with open(FRENCH / f"{domain}.mo", "rb") as mo:
        compiled = {key: value for key, value in gettext.GNUTranslations(mo)._catalog.items() if key != ""}
    expected = {}
    for msgid, entry in read_po(FRENCH / f"{domain}.po").items():
        if entry["plural"]:
            expected.update({(msgid, index): text for index, text in entry["strings"].items()})
        else:
            expected[msgid] = entry["strings"][0]
    assert compiled == expected, f"locale/fr/{domain}.mo is stale: run compilemessages (see README)"


# --- pages and errors in the browser's language --------------------------------------


@pytest.mark.django_db
def test_the_sign_in_page_follows_the_browser_language(client):
    french = client.get("/accounts/login/", HTTP_ACCEPT_LANGUAGE="fr-FR,fr;q=0.9,en;q=0.5").content.decode()
    assert '<html lang="fr">' in french
    assert "Se connecter" in french and "Mot de passe oublié" in french and "Sign in" not in french
    english = client.get("/accounts/login/", HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9").content.decode()
    assert '<html lang="en">' in english
    assert "Sign in" in english and "Forgot your password?" in english
    # A language we do not ship falls back to English.
    assert "Sign in" in client.get("/accounts/login/", HTTP_ACCEPT_LANGUAGE="de-DE").content.decode()


@pytest.mark.django_db
def test_every_pages_title_is_french_for_a_french_browser(client, alice):
    client.force_login(alice)
    for path in ("/", "/settings/", "/settings/tokens/", "/usage/", "/accounts/password_change/", "/no-such-page/"):
        page = client.get(path, HTTP_ACCEPT_LANGUAGE="fr-FR").content.decode()
        title = re.search(r"<title>(.*?)</title>", page, re.S).group(1)
        assert "Chat d’équipe" in title and "Team chat" not in title, (path, title)


@pytest.mark.django_db
def test_the_script_catalogue_is_loaded_before_the_modules_and_is_french_for_a_french_browser(client, alice):
    client.force_login(alice)
    page = client.get("/", HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    assert page.index('<script src="/jsi18n/" defer>') < page.index('type="module"')
    assert "Nouvelle conversation" in page
    catalogue = client.get("/jsi18n/", HTTP_ACCEPT_LANGUAGE="fr")
    assert catalogue["Content-Type"].startswith("text/javascript")
    assert "Nouvelle conversation" in catalogue.content.decode()
    assert "Nouvelle conversation" not in client.get("/jsi18n/", HTTP_ACCEPT_LANGUAGE="en").content.decode()


@pytest.mark.django_db
def test_error_pages_and_api_errors_are_in_the_browser_language(client, alice):
    client.force_login(alice)
    missing = client.get("/c/999999/", HTTP_ACCEPT_LANGUAGE="fr")
    assert missing.status_code == 404 and "Page introuvable" in missing.content.decode()
    detail = client.get("/api/conversations/999999", HTTP_ACCEPT_LANGUAGE="fr").json()["error"]["detail"]
    assert detail == "Cette conversation n’existe pas."
    english = client.get("/api/conversations/999999", HTTP_ACCEPT_LANGUAGE="en").json()["error"]["detail"]
    assert english == "No such conversation."


@pytest.mark.django_db
def test_the_settings_switch_overrides_the_browser_language():
    client = Client(HTTP_ACCEPT_LANGUAGE="en-US")
    page = client.get("/accounts/login/")
    assert "Sign in" in page.content.decode()
    answer = client.post("/i18n/setlang/", {"language": "fr", "next": "/accounts/login/"})
    assert answer.status_code == 302 and answer["Location"] == "/accounts/login/"
    assert client.cookies[settings.LANGUAGE_COOKIE_NAME].value == "fr"
    assert "Se connecter" in client.get("/accounts/login/").content.decode()
    client.post("/i18n/setlang/", {"language": "en", "next": "/accounts/login/"})
    assert "Sign in" in client.get("/accounts/login/").content.decode()


# --- the websocket answers in the language of its page -----------------------------------


async def socket_error(user, *headers: tuple[bytes, bytes], frame: dict | None = None, code: str = "not_found") -> str:
    from asgiref.sync import sync_to_async

    from chat.ws.routing import websocket_application

    cookie = await sync_to_async(session_cookie)(user)
    extra = [value.decode() for name, value in headers if name == b"cookie"]
    cookies = "; ".join([f"{settings.SESSION_COOKIE_NAME}={cookie}", *extra])
    sent = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000"), (b"cookie", cookies.encode())]
    sent += [(k, v) for k, v in headers if k != b"cookie"]
    communicator = WebsocketCommunicator(websocket_application, "/ws/chat/", headers=sent)
    accepted, _code = await communicator.connect()
    assert accepted
    try:
        await communicator.send_json_to(frame or {"type": "attach", "conversation": 999999})
        answer = await communicator.receive_json_from(10)
    finally:
        await communicator.disconnect()
    assert answer["type"] == "error" and answer["code"] == code, answer
    return answer["detail"]


@pytest.mark.django_db(transaction=True)
async def test_the_socket_words_its_errors_in_the_language_of_its_page(alice):
    assert await socket_error(alice, (b"accept-language", b"fr-FR,fr;q=0.9")) == "Cette conversation n’existe pas."
    assert await socket_error(alice, (b"accept-language", b"en-GB,en;q=0.9")) == "No such conversation."
    assert await socket_error(alice) == "No such conversation."
    # The switch's cookie wins over the browser's language.
    french_cookie = f"{settings.LANGUAGE_COOKIE_NAME}=fr".encode()
    english = (b"accept-language", b"en-US")
    assert await socket_error(alice, english, (b"cookie", french_cookie)) == "Cette conversation n’existe pas."


@pytest.mark.django_db(transaction=True)
async def test_refusals_worded_on_a_database_thread_are_in_the_language_of_the_page(alice, providers):
    """A budget used up is found on a database thread, where Django's active language did not follow."""
    from chat.metering.budgets import Budget

    await Budget.objects.acreate(user=alice, usd=0)
    french = (b"accept-language", b"fr-FR,fr;q=0.9")
    send = {"type": "send", "conversation": None, "content": "hi", "model": MODELS["i14"]}
    said = await socket_error(alice, french, frame=send, code="budget_exceeded")
    assert said.startswith("Votre budget mensuel de $0.00 est épuisé")
    said = await socket_error(alice, frame=send, code="budget_exceeded")
    assert said.startswith("Your monthly budget of $0.00 is used up")  # and back in English for an English page
