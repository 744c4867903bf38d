"""MCP servers in the admin: write-only secrets, a connection test, their tools listed and set; the calls audited."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from chat.models import Conversation, ConversationRead, McpServer, McpTool, Message, ToolCall
from tests.fakeserver import FakeServer
from tests.mcp_servers.server import guarded
from tests.mcp_servers.server import server as mcp_server

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "mcp-bearer-very-secret-77"
NO_TOOLS = {"tool_settings-TOTAL_FORMS": "0", "tool_settings-INITIAL_FORMS": "0"}


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", password="root-pw-123456"))
    return client


@pytest.fixture(scope="module")
def guarded_mcp():
    """The test server behind a bearer secret."""
    with FakeServer(guarded(mcp_server.streamable_http_app(), SECRET), lifespan="on") as served:
        yield served.url + "/mcp"


def test_a_server_saved_with_its_secret_lists_its_tools_and_never_shows_the_secret(staff_client, guarded_mcp, team):
    data = {"name": "guarded", "url": guarded_mcp, "bearer": "wrong", "new_headers": '{"X-Team": "header-secret-9"}',
            "groups": [team.pk], "enabled": "on", **NO_TOOLS}  # fmt: skip
    response = staff_client.post("/admin/chat/mcpserver/add/", data, follow=True)
    said = " ".join(str(m) for m in response.context["messages"])
    server = McpServer.objects.get(name="guarded")
    assert server.health == "down" and "is down" in said and "wrong" not in server.last_error
    assert server.headers == {"X-Team": "header-secret-9"} and list(server.groups.all()) == [team]

    # The right secret: up, tools listed, one settings row per tool. Empty fields keep the secrets.
    edit = {**data, "bearer": SECRET, "new_headers": ""}
    response = staff_client.post(f"/admin/chat/mcpserver/{server.pk}/change/", edit, follow=True)
    server.refresh_from_db()
    assert server.health == "up" and server.bearer == SECRET and server.headers == {"X-Team": "header-secret-9"}
    assert {t["name"] for t in server.tools} >= {"echo", "hang", "hostile"}
    assert set(McpTool.objects.filter(server=server).values_list("name", flat=True)) == {
        t["name"] for t in server.tools
    }

    for url in ("/admin/chat/mcpserver/", f"/admin/chat/mcpserver/{server.pk}/change/"):
        page = staff_client.get(url).content.decode()
        assert SECRET not in page and "header-secret-9" not in page
    page = staff_client.get(f"/admin/chat/mcpserver/{server.pk}/change/").content.decode()
    assert "X-Team" in page and "Bearer secret" in page and 'rel="icon"' in page
    assert "guarded__echo" in page  # each tool's row is titled with the name the model sees
    assert "tests__echo" in page  # the name's help shows it whole (Django renders help text as HTML)

    action = {"action": "test_connection", "_selected_action": [server.pk]}
    response = staff_client.post("/admin/chat/mcpserver/", action, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert any(text.startswith("“guarded” is up: echo, add") for text in said), said


def test_saving_a_server_that_does_not_answer_holds_no_one_elses_save(staff_client, django_user_model):
    """The listing waits for the server outside the admin's transaction: SQLite's write lock is free meanwhile."""
    alice = django_user_model.objects.create_user("alice")
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, and answers nothing until told
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
        data = {"name": "silent", "url": url, "enabled": "on", **NO_TOOLS}
        with ThreadPoolExecutor(1) as pool:
            saving = pool.submit(staff_client.post, "/admin/chat/mcpserver/add/", data)
            held, _ = listener.accept()  # the save is listing the tools now
            with held:
                with connection.cursor() as cursor:
                    cursor.execute("PRAGMA busy_timeout = 1000")  # a held write lock fails this within a second
                Conversation.objects.create(owner=alice, title="saved meanwhile")
            assert saving.result(timeout=60).status_code == 302
    assert McpServer.objects.get(name="silent").health == "down"


def test_a_link_local_url_is_refused(staff_client):
    data = {"name": "meta", "url": "http://169.254.169.254/mcp", "enabled": "on", **NO_TOOLS}
    response = staff_client.post("/admin/chat/mcpserver/add/", data)
    assert response.status_code == 200 and not McpServer.objects.exists()
    assert "link-local" in response.content.decode()


def test_staff_see_the_calls_in_the_conversation_review(staff_client, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    conversation = Conversation.objects.create(owner=alice, title="tools")
    call = {"id": "c1", "name": "tests__echo", "server": "tests", "tool": "echo", "arguments": "{}", "status": "ok",
            "result": "<script>bad()</script>"}  # fmt: skip
    rounds = [{"at": 0, "calls": [call]}]
    message = Message.objects.create(conversation=conversation, role="assistant", content="x", tool_rounds=rounds)
    ToolCall.objects.create(user=alice, conversation=conversation, message=message, server="tests", tool="echo",
                            arguments={"text": "sea-shanty"}, status="ok", result_bytes=8, duration_ms=12)  # fmt: skip
    page = staff_client.get(f"/admin/chat/conversation/{conversation.pk}/change/").content.decode()
    assert "tests.echo (ok)" in page and "column-result_bytes" in page
    assert "Tool call · echo · tests · ok" in page  # in the review, drawn as the chat shows the answer
    assert "<script>bad()" not in page and "&lt;script&gt;bad()" in page
    listing = staff_client.get("/admin/chat/toolcall/").content.decode()
    assert "echo" in listing and "tests" in listing
    assert "sea-shanty" not in listing  # the list shows no arguments
    reads = ConversationRead.objects.filter(where="admin tool call")
    assert not reads.exists()
    tool_call = ToolCall.objects.get()
    page = staff_client.get(f"/admin/chat/toolcall/{tool_call.pk}/change/").content.decode()
    assert "sea-shanty" in page  # its arguments: someone's content, so the read is recorded
    read = reads.get()
    assert (read.conversation, read.owner, read.title) == (conversation, alice, "tests.echo call (in “tools”)")


def test_a_tool_servers_url_and_session_stay_out_of_the_log(caplog, mcp_http):
    """The MCP SDK's HTTP client logs every request's URL at INFO, and the SDK a server's session id:
    a URL may carry a key, and a session id lets whoever reads the log act in that session."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from chat.actions import tool_servers

    caplog.set_level(logging.INFO)
    server = McpServer.objects.create(name="logged", url=mcp_http + "?key=mcp-url-secret-55")
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(tool_servers.refresh_now, server).result() == ""
    assert McpTool.objects.filter(server=server).exists()  # requests were made and answered
    logged = [record.getMessage() for record in caplog.records]
    assert not [line for line in logged if "mcp-url-secret-55" in line or "session id" in line.lower()]


def test_a_server_whose_address_is_link_local_is_refused_at_each_use_not_only_on_save():
    """Saved past the admin's check (or its name resolving elsewhere since): the request is never sent."""
    from concurrent.futures import ThreadPoolExecutor

    from chat.actions import tool_servers

    server = McpServer.objects.create(name="metadata", url="http://169.254.169.254/mcp")
    with ThreadPoolExecutor(1) as pool:
        error = pool.submit(tool_servers.refresh_now, server).result()
    assert "169.254.169.254 is link-local or a cloud metadata service, which is refused" in error


def test_stdio_rows_follow_the_file_and_a_process_without_one_leaves_them(stdio_file, settings):
    """A process without MCP_SERVERS_FILE (not yet restarted with it, or the tests' live server beside a test that
    set it) disabled every stdio row the others had made."""
    from chat.streaming.tool_catalog import stdio_servers, sync_stdio_servers

    sync_stdio_servers()
    assert McpServer.objects.get(name="local").enabled
    settings.MCP_SERVERS_FILE = ""
    stdio_servers.cache_clear()
    sync_stdio_servers()
    assert McpServer.objects.get(name="local").enabled  # no file, no say
    stdio_file.write_text('{"servers": {}}')
    settings.MCP_SERVERS_FILE = str(stdio_file)
    stdio_servers.cache_clear()
    sync_stdio_servers()
    assert not McpServer.objects.get(name="local").enabled  # gone from the file: disabled
