"""The page view and the conversations JSON API: own data only, clear errors, CSP on every page."""

import json

import pytest
from django.test import Client

from chat.models import Conversation, Message, Provider, Usage
from chat.models.providers import DEMO_PROVIDER

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def chats(alice, bob):
    poem = Conversation.objects.create(owner=alice, title="Ocean poem")
    asked = Message.objects.create(conversation=poem, role="user", content="Write about the sea")
    reply = Message.objects.create(
        conversation=poem, role="assistant", content="Waves **roll**", reasoning="hmm", parent=asked
    )
    Conversation.objects.filter(pk=poem.pk).update(current=reply)
    Usage.objects.create(user=alice, message=reply, model="m", status="complete", prompt_tokens=3, completion_tokens=4)
    recipes = Conversation.objects.create(owner=alice, title="Soup")
    Message.objects.create(conversation=recipes, role="user", content="A recipe with leeks")
    theirs = Conversation.objects.create(owner=bob, title="Bob's ocean secrets")
    Message.objects.create(conversation=theirs, role="user", content="sea")
    return poem, recipes, theirs


def test_pages_need_a_signed_in_user(client, chats):
    for url in ("/", f"/c/{chats[0].pk}/", "/settings/tokens/", "/docs/api/"):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/accounts/login/")
    for url in ("/api/conversations", "/api/models"):
        response = client.get(url)
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"


def test_page_carries_its_config_and_a_strict_csp(alice_client, chats):
    response = alice_client.get(f"/c/{chats[0].pk}/")
    assert response.status_code == 200
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "img-src 'self' data:" in csp
    config = response.context["config"]
    assert config["conversation"] == chats[0].pk and config["wsPath"] == "/ws/chat/" and config["csrfToken"]
    assert b'id="chat-config"' in response.content


def test_json_answers_are_never_stored_by_a_cache(alice_client, chats):
    url = f"/api/conversations/{chats[0].pk}"
    responses = [
        alice_client.get("/api/conversations"),
        alice_client.get(url),
        alice_client.patch(url, json.dumps({"title": "Sea"}), content_type="application/json"),
        alice_client.patch(url, "{not json", content_type="application/json"),  # an error is JSON too
        Client().get("/api/models"),  # 401
    ]
    for response in responses:
        assert response["Content-Type"] == "application/json"
        assert "no-store" in response["Cache-Control"], response.request["PATH_INFO"]


def test_another_users_conversation_page_is_404(alice_client, chats):
    assert alice_client.get(f"/c/{chats[2].pk}/").status_code == 404
    assert alice_client.get("/c/999999/").status_code == 404


def test_list_is_newest_first_and_own_only(alice_client, chats):
    titles = [c["title"] for c in alice_client.get("/api/conversations").json()["conversations"]]
    assert titles == ["Soup", "Ocean poem"]


def test_search_matches_titles_and_message_text_server_side(alice_client, chats):
    def search(q):
        return [c["title"] for c in alice_client.get("/api/conversations", {"q": q}).json()["conversations"]]

    assert search("leeks") == ["Soup"]  # message text
    assert search("ocean") == ["Ocean poem"]  # title; bob's "ocean" is not found
    assert search("roll") == ["Ocean poem"]  # an assistant message
    assert search("nothing like this") == []


def test_detail_has_messages_with_usage(alice_client, chats):
    body = alice_client.get(f"/api/conversations/{chats[0].pk}").json()
    assert body["title"] == "Ocean poem" and body["streaming"] is None
    user, reply = body["messages"]
    assert user["role"] == "user" and user["usage"] is None
    assert reply["content"] == "Waves **roll**" and reply["reasoning"] == "hmm"
    assert reply["usage"]["completion_tokens"] == 4 and reply["status"] == "complete"


def test_rename_settings_and_delete(alice_client, chats):
    url = f"/api/conversations/{chats[0].pk}"

    def patch(body):
        return alice_client.patch(url, json.dumps(body), content_type="application/json")

    assert patch({"title": "  Sea poem  "}).json()["title"] == "Sea poem"
    body = patch({"system_prompt": "Answer in verse.", "params": {"temperature": 0.3, "max_tokens": 500}}).json()
    assert body["system_prompt"] == "Answer in verse." and body["params"] == {"temperature": 0.3, "max_tokens": 500}
    assert patch({"params": {"temperature": None}}).json()["params"] == {"max_tokens": 500}
    for bad, code in (({"title": ""}, "bad_field"), ({"params": {"temperature": 9}}, "bad_param"), ({}, "bad_field")):
        response = patch(bad)
        assert response.status_code == 400 and response.json()["error"]["code"] == code
    response = alice_client.patch(url, "not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_json"
    assert alice_client.delete(url).status_code == 204
    assert not Conversation.objects.filter(pk=chats[0].pk).exists()
    assert Usage.objects.get().message is None  # metering outlives the conversation


def test_another_users_conversation_is_a_404_for_every_method(alice_client, chats):
    url = f"/api/conversations/{chats[2].pk}"
    for response in (
        alice_client.get(url),
        alice_client.patch(url, json.dumps({"title": "mine"}), content_type="application/json"),
        alice_client.delete(url),
    ):
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    chats[2].refresh_from_db()
    assert chats[2].title == "Bob's ocean secrets"


def test_unsafe_methods_need_the_csrf_token(alice, chats):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    url = f"/api/conversations/{chats[0].pk}"
    refused = strict.delete(url)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_failed"  # JSON the page shows
    assert "reload the page" in refused.json()["error"]["detail"]
    assert "CSRF verification failed" in strict.post("/settings/delete-conversations/").content.decode()  # a form's
    token = strict.get("/").context["config"]["csrfToken"]
    assert strict.delete(url, headers={"X-CSRFToken": token}).status_code == 204


def test_settings_form_carries_the_servers_bounds(alice_client):
    page = alice_client.get("/").content.decode()
    assert 'id="param-max-tokens" min="1" max="32768"' in page
    assert 'id="param-system-prompt" rows="3" maxlength="20000"' in page


def test_a_missing_or_foreign_conversation_gets_a_styled_404_with_a_way_back(alice_client, chats):
    for url in (f"/c/{chats[2].pk}/", "/c/999999999/", "/no/such/page/"):
        response = alice_client.get(url)
        page = response.content.decode()
        assert response.status_code == 404 and "Page not found" in page and 'href="/"' in page
        assert "/static/chat/app." in page  # the site's own look, not Django's bare "Not Found"


def test_the_500_page_renders_without_a_request():
    from django.template.loader import render_to_string

    page = render_to_string("500.html")
    assert "Something went wrong" in page and 'href="/"' in page


def test_creating_a_token_redirects_and_shows_its_secret_once(alice_client, alice):
    response = alice_client.post("/settings/tokens/", {"name": "laptop"})
    assert response.status_code == 302 and response.url == "/settings/tokens/"
    first = alice_client.get("/settings/tokens/").content.decode()
    secret = first.split('data-testid="new-token" id="new-token">', 1)[1].split("<", 1)[0]
    assert secret.startswith("sk-chat-")
    again = alice_client.get("/settings/tokens/").content.decode()  # a reload: no secret, no second token
    assert secret not in again and "laptop" in again and alice.api_tokens.count() == 1
    refused = alice_client.post("/settings/tokens/", {"name": ""})
    assert refused.status_code == 400 and alice.api_tokens.count() == 1


def test_the_api_guide_is_a_page_of_the_site(alice_client):
    response = alice_client.get("/docs/api/")
    page = response.content.decode()
    assert response.status_code == 200 and 'id="guide-text"' in page and "The OpenAI-compatible API" in page
    assert "http://testserver/v1" in page


@pytest.mark.parametrize("demo", [True, False])
def test_a_server_without_a_real_model_tells_staff_how_to_add_one_and_others_whom_to_ask(alice, django_user_model,
                                                                                        demo):  # fmt: skip
    Provider.objects.all().delete()
    if demo:
        Provider.objects.create(name=DEMO_PROVIDER, base_url="http://127.0.0.1:8000/_demo/v1", api_key="demo")
    staff = django_user_model.objects.create_user("staff", password="x", is_staff=True)
    pages = {}
    for person in (staff, alice):
        client = Client()
        client.force_login(person)
        pages[person] = client.get("/").content.decode()
    banner = 'id="demo-banner"' if demo else 'id="no-provider-banner"'
    assert banner in pages[staff] and banner in pages[alice]
    assert "UPSTREAM_BASE_URL" in pages[staff] and 'href="/admin/"' in pages[staff]
    assert "Ask an administrator" not in pages[staff]
    # Someone who cannot reach the admin is not sent there, nor told about the server's environment.
    assert "UPSTREAM_BASE_URL" not in pages[alice] and 'href="/admin/"' not in pages[alice]
    assert "Ask an administrator to connect" in pages[alice]


def test_an_unknown_api_path_is_a_json_404(alice_client):
    response = alice_client.get("/api/nope")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["error"] == {"code": "not_found", "detail": "There is no /api/nope in this server's API."}
