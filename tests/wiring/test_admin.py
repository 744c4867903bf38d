"""Staff pages: providers with a write-only key, conversations with messages, usage with totals."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission

from chat.actions.shares import create_share
from chat.models import ApiToken, Conversation, ConversationRead, Message, Provider, Share, Usage

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", password="root-pw-123456"))
    return client


# The provider page's inline of model access limits (none posted).
NO_LIMITS = {"access_rules-TOTAL_FORMS": "0", "access_rules-INITIAL_FORMS": "0"}


@pytest.fixture
def provider():
    return Provider.objects.create(name="i14", base_url="https://api.i14.ai/v1", api_key="sk-very-secret-key-42")


def test_provider_key_is_never_rendered(staff_client, provider):
    for url in ("/admin/chat/provider/", f"/admin/chat/provider/{provider.pk}/change/"):
        page = staff_client.get(url)
        assert page.status_code == 200 and b"sk-very-secret-key-42" not in page.content
    assert b"api.i14.ai" in staff_client.get("/admin/chat/provider/").content


@pytest.fixture
def viewer(client, django_user_model):
    """Staff who may only view providers, MCP servers, usage rows and messages."""
    user = django_user_model.objects.create_user("viewer", password="viewer-pw-123456", is_staff=True)
    codenames = ["view_provider", "view_mcpserver", "view_usage", "view_message"]
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="chat", codename__in=codenames))
    client.force_login(user)
    return client


def test_staff_who_may_only_view_see_no_secret_and_run_no_action(viewer, provider, history):
    from chat.models import McpServer

    page = viewer.get(f"/admin/chat/provider/{provider.pk}/change/").content.decode()
    assert "sk-very-secret-key-42" not in page and "Key set:" in page  # Django showed a read-only field's value
    server = McpServer.objects.create(name="search", url="https://mcp.example.com/mcp", bearer="bearer-secret-77")
    page = viewer.get(f"/admin/chat/mcpserver/{server.pk}/change/").content.decode()
    assert "bearer-secret-77" not in page and "Bearer secret set:" in page
    for listing in ("provider", "mcpserver", "usage", "message"):
        assert "Test connection" not in viewer.get(f"/admin/chat/{listing}/").content.decode()
    reply = history.messages.get(role="assistant")
    Message.objects.filter(pk=reply.pk).update(status="streaming")
    for listing, pk in (("message", reply.pk), ("usage", reply.usages.get().pk)):
        page = viewer.get(f"/admin/chat/{listing}/").content.decode()
        assert "Stop the selected streams" not in page and "Mark the selected orphaned" not in page
        viewer.post(f"/admin/chat/{listing}/", {"action": "stop_streams", "_selected_action": [pk]})
    reply.refresh_from_db()
    assert not reply.stop_requested  # the action was not theirs to run


def test_saving_a_provider_with_an_empty_key_keeps_the_key(staff_client, provider):
    data = {"name": "i14", "base_url": "https://api.i14.ai/v1", "api_key": "", "default_model": "m", "model_list": "",
            **NO_LIMITS}  # fmt: skip
    response = staff_client.post(f"/admin/chat/provider/{provider.pk}/change/", {**data, "enabled": "on"})
    assert response.status_code == 302
    provider.refresh_from_db()
    assert provider.api_key == "sk-very-secret-key-42" and provider.default_model == "m"
    staff_client.post(f"/admin/chat/provider/{provider.pk}/change/", {**data, "api_key": "new-key", "enabled": "on"})
    provider.refresh_from_db()
    assert provider.api_key == "new-key"


@pytest.fixture
def history(django_user_model, provider):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    conversation = Conversation.objects.create(owner=alice, title="Ocean poems", model="i14/m")
    Message.objects.create(conversation=conversation, role="user", content="Write a poem")
    reply = Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="Waves",
        reasoning="Let me think about waves",
        status="stopped",
    )
    Usage.objects.create(
        user=alice,
        provider=provider,
        message=reply,
        model="model-a",
        status="stopped",
        prompt_tokens=10,
        completion_tokens=20,
        reasoning_tokens=5,
        total_tokens=30,
        cost=Decimal("0.25"),
        ttft_ms=120,
    )
    Usage.objects.create(
        user=bob,
        provider=provider,
        model="model-b",
        status="complete",
        source="api",
        prompt_tokens=1,
        completion_tokens=2,
        total_tokens=3,
        cost=Decimal("0.5"),
    )
    return conversation


def test_conversation_shows_its_messages_with_reasoning_and_status(staff_client, history):
    page = staff_client.get(f"/admin/chat/conversation/{history.pk}/change/").content.decode()
    assert "Write a poem" in page and "Let me think about waves" in page and "stopped by the user" in page
    listing = staff_client.get("/admin/chat/conversation/", {"q": "alice"}).content.decode()
    assert "Ocean poems" in listing
    assert "Ocean poems" not in staff_client.get("/admin/chat/conversation/", {"q": "bob"}).content.decode()


def test_a_conversations_messages_show_their_usage_and_link_to_its_rows(staff_client, history):
    page = staff_client.get(f"/admin/chat/conversation/{history.pk}/change/").content.decode()
    assert "10 in · 20 out (5 reasoning) · $0.25" in page and "TTFT 120 ms" in page  # as the chat shows it
    usage = Usage.objects.get(message__conversation=history)
    assert f'href="/admin/chat/usage/{usage.pk}/change/"' in page
    rows = f"/admin/chat/usage/?message__conversation__id__exact={history.pk}"
    assert rows.replace("&", "&amp;") in page or rows in page
    listing = staff_client.get(rows)
    assert listing.status_code == 200 and [u.pk for u in listing.context["cl"].result_list] == [usage.pk]
    assert f'href="/admin/chat/conversation/{history.pk}/change/"' in listing.content.decode()
    assert f"/usage/?user={history.owner_id}" in page


def test_test_connection_reports_and_records_each_providers_health(staff_client, providers):
    reachable = Provider.objects.get(name="i14")
    dead = Provider.objects.create(name="gone", base_url="http://127.0.0.1:9/v1", api_key="k")
    response = staff_client.post(
        "/admin/chat/provider/",
        {"action": "test_connection", "_selected_action": [reachable.pk, dead.pk]},
        follow=True,
    )
    said = [str(message) for message in response.context["messages"]]
    assert any(text.startswith("“i14” is reachable:") and "models listed in" in text for text in said), said
    assert any(text.startswith("“gone” cannot list its models") for text in said), said
    page = response.content.decode()
    assert "“i14” is reachable" in page and "I14" not in page  # the admin's capfirst leaves a quoted name be
    reachable.refresh_from_db()
    dead.refresh_from_db()
    assert reachable.reached is not None and not reachable.last_error
    assert dead.reached is None and dead.last_error and dead.last_error_at is not None
    listing = staff_client.get("/admin/chat/provider/").content.decode()
    assert "reached 0" in listing and 'class="provider-error"' in listing


def test_usage_list_filters_and_totals(staff_client, history):
    def listing(**query):
        response = staff_client.get("/admin/chat/usage/", query)
        return [u.model for u in response.context["cl"].result_list], response.content.decode()

    models, page = listing()
    assert sorted(models) == ["model-a", "model-b"]
    assert "2 streams" in page and "33 in all" in page and "$0.7500" in page
    models, page = listing(source__exact="chat")
    assert models == ["model-a"] and "1 streams" in page and "30 in all" in page and "(5 reasoning)" in page
    models, page = listing(status__exact="complete", model="model-b")
    assert models == ["model-b"] and "3 in all" in page
    bob = history.owner.__class__.objects.get(username="bob")
    assert listing(user__id__exact=bob.pk)[0] == ["model-b"]
    assert staff_client.get("/admin/chat/usage/add/").status_code == 403


def test_provider_connection_limit_is_an_admin_field(staff_client, provider):
    data = {"name": "i14", "base_url": "https://api.i14.ai/v1", "api_key": "", "model_list": "", "enabled": "on",
            **NO_LIMITS}  # fmt: skip
    page = staff_client.get(f"/admin/chat/provider/{provider.pk}/change/").content.decode()
    assert 'name="max_connections"' in page and "UPSTREAM_PROVIDER_MAX_CONNECTIONS" in page
    staff_client.post(f"/admin/chat/provider/{provider.pk}/change/", {**data, "max_connections": "2"})
    provider.refresh_from_db()
    assert provider.max_connections == 2
    response = staff_client.post(f"/admin/chat/provider/{provider.pk}/change/", {**data, "max_connections": "-1"})
    provider.refresh_from_db()
    assert response.status_code == 200 and provider.max_connections == 2  # refused with the form's error


def staff_with(django_user_model, username: str, *codenames: str):
    """A staff user (not a superuser) holding only the named chat permissions."""
    user = django_user_model.objects.create_user(username, password="staff-pw-123456", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="chat", codename__in=codenames))
    return user


def revoke_post(client, token):
    return client.post(
        "/admin/chat/apitoken/", {"action": "revoke", "_selected_action": [token.pk], "index": 0}, follow=True
    )


def test_revoking_tokens_needs_the_change_permission(client, django_user_model):
    token, _secret = ApiToken.issue(django_user_model.objects.create_user("alice"), "laptop")
    client.force_login(staff_with(django_user_model, "viewer", "view_apitoken"))
    listing = client.get("/admin/chat/apitoken/")
    assert listing.status_code == 200 and b"laptop" in listing.content
    assert b"Revoke the selected tokens" not in listing.content
    revoke_post(client, token)
    token.refresh_from_db()
    assert token.revoked is None

    client.force_login(staff_with(django_user_model, "changer", "view_apitoken", "change_apitoken"))
    assert b"Revoke the selected tokens" in client.get("/admin/chat/apitoken/").content
    assert b"Revoked 1 token(s)." in revoke_post(client, token).content
    token.refresh_from_db()
    assert token.revoked is not None


# --- where a provider's key may go -------------------------------------------------


def provider_form(**changes):
    data = {"name": "i14", "base_url": "https://api.i14.ai/v1", "api_key": "", "default_model": "", "model_list": ""}
    return {**data, "enabled": "on", **NO_LIMITS, **changes}


@pytest.mark.parametrize(
    "base_url",
    [
        "https://listener.example/v1",
        "http://api.i14.ai/v1",
        "https://api.i14.ai:8443/v1",
        "https://api.i14.ai.evil.example/v1",
    ],
)
def test_a_base_url_on_another_server_needs_the_key_entered_again(staff_client, provider, base_url):
    url = f"/admin/chat/provider/{provider.pk}/change/"
    response = staff_client.post(url, provider_form(base_url=base_url))
    assert response.status_code == 200
    assert "enter the API key again" in response.context["adminform"].form.errors["api_key"][0]
    provider.refresh_from_db()
    assert provider.base_url == "https://api.i14.ai/v1" and provider.api_key == "sk-very-secret-key-42"

    # Typed again (even the same key): the person who changed the URL knows the key.
    assert staff_client.post(url, provider_form(base_url=base_url, api_key="sk-very-secret-key-42")).status_code == 302
    provider.refresh_from_db()
    assert provider.base_url == base_url and provider.api_key == "sk-very-secret-key-42"


def test_a_new_path_on_the_same_server_keeps_the_key(staff_client, provider):
    url = f"/admin/chat/provider/{provider.pk}/change/"
    assert staff_client.post(url, provider_form(base_url="https://API.i14.ai:443/v2")).status_code == 302
    provider.refresh_from_db()
    assert provider.base_url == "https://API.i14.ai:443/v2" and provider.api_key == "sk-very-secret-key-42"


def test_the_form_refuses_a_kept_key_on_another_server(provider):
    from chat.admin.providers import ProviderForm

    form = ProviderForm(provider_form(base_url="https://listener.example/v1"), instance=provider)
    assert not form.is_valid() and "enter the API key again" in form.errors["api_key"][0]
    form = ProviderForm(provider_form(base_url="https://listener.example/v1", api_key="sk-new"), instance=provider)
    assert form.is_valid(), form.errors


LINK_LOCAL_URLS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/v1",
    "http://[fe80::1]:8080/v1",
    "http://[::ffff:169.254.169.254]/v1",
]


@pytest.mark.parametrize("base_url", LINK_LOCAL_URLS)
def test_link_local_and_metadata_base_urls_are_refused_unless_allowed(staff_client, settings, base_url):
    form = provider_form(name="meta", base_url=base_url, api_key="k")
    response = staff_client.post("/admin/chat/provider/add/", form)
    assert response.status_code == 200
    error = response.context["adminform"].form.errors["base_url"][0]
    assert "link-local or cloud metadata address" in error and "UPSTREAM_ALLOW_LINK_LOCAL" in error
    assert not Provider.objects.filter(name="meta").exists()

    settings.UPSTREAM_ALLOW_LINK_LOCAL = True
    assert staff_client.post("/admin/chat/provider/add/", form).status_code == 302
    assert Provider.objects.get(name="meta").base_url == base_url


def test_staff_reading_a_conversation_is_recorded_and_listed(staff_client, history, settings, client):
    staff_client.get(f"/admin/chat/conversation/{history.pk}/change/")
    read = ConversationRead.objects.get()
    assert read.conversation == history and read.owner == history.owner and read.reader.username == "root"
    assert read.title == "Ocean poems"
    listing = staff_client.get("/admin/chat/conversationread/").content.decode()
    assert "Ocean poems" in listing and "root" in listing
    assert staff_client.get(f"/admin/chat/conversationread/{read.pk}/delete/").status_code == 403
    # The owner sees "Reviewed by" only where the server is set to tell them.
    client.force_login(history.owner)
    assert client.get(f"/api/conversations/{history.pk}").json()["reviewed_by"] is None
    settings.CHAT_SHOW_REVIEWS = True
    assert [r["reader"] for r in client.get(f"/api/conversations/{history.pk}").json()["reviewed_by"]] == ["root"]
    history.delete()  # the record of the read outlives the conversation
    assert ConversationRead.objects.get().title == "Ocean poems"


def test_every_response_that_shows_a_conversation_is_recorded_whatever_its_method(staff_client, history):
    """Django's admin renders a change page for OPTIONS as for GET, and shows it again when a POST is refused."""
    reply = history.messages.get(role="assistant")
    for url in (f"/admin/chat/conversation/{history.pk}/change/", f"/admin/chat/message/{reply.pk}/change/"):
        response = staff_client.options(url)
        assert response.status_code == 200 and "Waves" in response.content.decode()
    refused = staff_client.post(f"/admin/chat/conversation/{history.pk}/change/", {"title": "x" * 5000})
    assert refused.status_code == 200 and "Waves" in refused.content.decode()
    assert staff_client.head(f"/admin/chat/conversation/{history.pk}/change/").content == b""  # shows nothing
    where = list(ConversationRead.objects.order_by("pk").values_list("where", flat=True))
    assert where == ["admin", "admin message", "admin"]


def test_an_owner_reading_their_own_conversation_is_not_recorded(client, history):
    history.owner.is_staff = history.owner.is_superuser = True
    history.owner.save()
    client.force_login(history.owner)
    assert client.get(f"/admin/chat/conversation/{history.pk}/change/").status_code == 200
    assert not ConversationRead.objects.exists()


def test_conversation_filters_and_no_add_button(staff_client, history, django_user_model):
    calm = Conversation.objects.create(owner=history.owner, title="Calm one", model="i14/m")
    Message.objects.create(conversation=calm, role="assistant", content="fine", status="complete")
    broken = Conversation.objects.create(owner=history.owner, title="Broken one", model="i14/m")
    Message.objects.create(conversation=broken, role="assistant", content="", status="failed")

    def titles(**query):
        response = staff_client.get("/admin/chat/conversation/", query)
        return sorted(c.title for c in response.context["cl"].result_list)

    assert titles(last_status="stopped") == ["Ocean poems"]
    assert titles(last_status="complete") == ["Calm one"]
    assert titles(failed="yes") == ["Broken one"]
    assert titles(failed="no") == ["Calm one", "Ocean poems"]
    assert staff_client.get("/admin/chat/conversation/add/").status_code == 403
    assert b"Add conversation" not in staff_client.get("/admin/chat/conversation/").content


def test_a_provider_page_limits_its_models_to_groups(staff_client, provider):
    from django.contrib.auth.models import Group

    research = Group.objects.create(name="research")
    form = provider_form(
        **{"access_rules-TOTAL_FORMS": "1", "access_rules-0-model": "", "access_rules-0-groups": [research.pk]}
    )
    assert staff_client.post(f"/admin/chat/provider/{provider.pk}/change/", form).status_code == 302
    (rule,) = provider.access_rules.all()
    assert rule.model == "" and list(rule.groups.all()) == [research]


def test_the_review_lays_out_the_branch_tree_like_the_chat_and_the_read_is_recorded(staff_client, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    conversation = Conversation.objects.create(owner=alice, title="Tree")
    ask = Message.objects.create(conversation=conversation, role="user", content="Question")
    old = Message.objects.create(conversation=conversation, parent=ask, role="assistant", content="<b>first</b> **md**",
                                 reasoning="thinking it over", thinking_ms=1200)  # fmt: skip
    new = Message.objects.create(conversation=conversation, parent=ask, role="assistant", content="Second answer")
    Usage.objects.create(user=alice, message=new, model="m", status="complete", prompt_tokens=7, completion_tokens=8)
    conversation.current = new
    conversation.save()
    response = staff_client.get(f"/admin/chat/conversation/{conversation.pk}/change/")
    rows = [(row.message.pk, row.depth, row.branch, row.on_path) for row in response.context["review"]]
    assert rows == [(ask.pk, 0, "", True), (old.pk, 1, "Branch 1 of 2", False), (new.pk, 1, "Branch 2 of 2", True)]
    page = response.content.decode()
    # Answers go to the page as escaped text, for the chat's renderer (static/chat/review.js) to draw.
    assert "&lt;b&gt;first&lt;/b&gt; **md**" in page and "<b>first</b>" not in page
    assert '<details class="review-reasoning">' in page and "thinking it over" in page
    assert page.count('class="review-usage"') == 1 and "7 in · 8 out" in page and "chat/review." in page
    assert f'href="/admin/auth/user/{alice.pk}/change/"' in page  # the person, beside their usage
    assert ConversationRead.objects.filter(conversation=conversation).count() == 1


def test_staff_see_share_links_and_revoke_one_by_deleting_it(staff_client, history):
    share = create_share(history, live=True, public=False, show_usage=False)
    listing = staff_client.get("/admin/chat/share/").content.decode()
    assert "Ocean poems" in listing and share.token not in listing
    assert staff_client.get("/admin/chat/share/add/").status_code == 403
    response = staff_client.post(f"/admin/chat/share/{share.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Share.objects.exists()


def test_a_negative_budget_or_price_is_refused_in_words(staff_client, django_user_model):
    person = django_user_model.objects.create_user("dora")
    page = staff_client.post("/admin/chat/budget/add/", {"user": person.pk, "usd": "-5", "tokens": ""}).content.decode()
    assert "A budget cannot be negative." in page and "budget_usd_not_negative" not in page
    nobody = staff_client.post("/admin/chat/budget/add/", {"usd": "5", "tokens": ""}).content.decode()
    assert nobody.count("A budget is for exactly one of: a user, a group, an API token.") == 1  # said once
    assert "budget_for_one_user_group_or_token" not in nobody
    price = {"model": "m", "prompt": "-1", "completion": "1", "effective_from_0": "2026-01-01",
             "effective_from_1": "0:00"}  # fmt: skip
    page = staff_client.post("/admin/chat/price/add/", price).content.decode()
    assert "A price cannot be negative." in page and "price_not_negative" not in page


def test_a_private_preset_and_personal_defaults_read_by_staff_are_recorded(staff_client, alice):
    from chat.models import ChatDefaults, PromptPreset

    preset = PromptPreset.objects.create(owner=alice, name="Leave", text="PRIVATE about my medical leave")
    defaults = ChatDefaults.objects.create(user=alice, system_prompt="PRIVATE alice is job hunting")
    page = staff_client.get(f"/admin/chat/promptpreset/{preset.pk}/change/")
    assert page.status_code == 200 and "medical leave" in page.text
    assert staff_client.get(f"/admin/chat/chatdefaults/{defaults.pk}/change/").status_code == 200
    reads = list(ConversationRead.objects.order_by("pk").values_list("owner__username", "reader__username", "title",
                                                                      "where"))  # fmt: skip
    assert reads == [("alice", "root", "preset “Leave”", "admin preset"),
                     ("alice", "root", "defaults (system prompt)", "admin defaults")]  # fmt: skip
    # The list cannot be searched by the private text, which would read it unrecorded.
    assert "Leave" not in staff_client.get("/admin/chat/promptpreset/?q=medical").text


def test_staff_cannot_publish_someone_elses_private_preset(staff_client, alice):
    from chat.models import PromptPreset

    preset = PromptPreset.objects.create(owner=alice, name="Leave", text="private")
    form = {"owner": alice.pk, "name": "Leave", "text": "private", "system_prompt": "", "model": "", "params": "{}",
            "published": "on"}  # fmt: skip
    refused = staff_client.post(f"/admin/chat/promptpreset/{preset.pk}/change/", form)
    assert refused.status_code == 200 and "Only its owner can publish a private preset" in refused.text
    changelist = {"form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-0-id": preset.pk,
                  "form-0-published": "on", "_save": "Save"}  # fmt: skip
    staff_client.post("/admin/chat/promptpreset/", changelist)
    preset.refresh_from_db()
    assert not preset.published
    # Withdrawing one that is published stays open to staff.
    PromptPreset.objects.filter(pk=preset.pk).update(published=True)
    staff_client.post("/admin/chat/promptpreset/", {**changelist, "form-0-published": ""})
    preset.refresh_from_db()
    assert not preset.published
