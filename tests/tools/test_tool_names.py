"""Tool names as the model sees them: what a provider accepts as a function's name, distinct, the same everywhere."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from chat.models import McpServer, tool_name
from chat.models.tools import FUNCTION_NAME
from chat.streaming.tool_catalog import tools_for

pytestmark = pytest.mark.django_db


def test_a_name_a_provider_would_refuse_is_made_to_fit_and_kept_apart():
    assert tool_name("tests", "echo") == "tests__echo"  # a fitting name is left as it is
    dotted, plain = tool_name("extra", "files.read"), tool_name("extra", "files_read")
    long = tool_name("a-server-with-a-long-name", "a_really_long_tool_name_that_some_servers_use_for_clarity_v2")
    for name in (dotted, long, tool_name("x", "ünïcode tool"), tool_name("s", "t" * 128)):
        assert FUNCTION_NAME.fullmatch(name), name
    assert dotted != plain and dotted.startswith("extra__files_read_")
    assert tool_name("extra", "files.read") == dotted  # the same in every process: chosen sets keep matching


def test_a_turn_offers_only_names_a_provider_accepts_and_never_two_alike(django_user_model):
    root = django_user_model.objects.create_superuser("root", password="x")
    schema = {"type": "object", "properties": {}}
    McpServer.objects.create(name="a", url="http://127.0.0.1:9/mcp", health="up",
                             tools=[{"name": "b__c", "input_schema": schema}, {"name": "files.read"}])  # fmt: skip
    McpServer.objects.bulk_create([  # as a row made before the admin refused the name (bulk_create skips checks)
        McpServer(name="a__b", url="http://127.0.0.1:9/mcp", health="up", tools=[{"name": "c", "input_schema": schema}])
    ])  # fmt: skip
    names = [spec.name for spec in tools_for(root, None)]
    assert len(names) == len(set(names)) == 2 and all(FUNCTION_NAME.fullmatch(name) for name in names)
    assert "a__b__c" in names  # the first server's: the clash is left out, with a warning


def test_a_server_name_with_two_underscores_in_a_row_is_refused():
    with pytest.raises(ValidationError, match="Two underscores"):
        McpServer(name="a__b", url="https://example.com/mcp").full_clean()
    McpServer(name="a_b-c", url="https://example.com/mcp").full_clean()


def test_a_cut_result_tells_the_model_how_much_of_it_it_has():
    from chat.streaming.tool_loop import Call

    call = Call(id="a", name="tests__big", arguments="{}", status="ok", result="x" * 1000, truncated=True)
    assert call.for_model() == "x" * 1000 + "\n[result cut to its first 1000 characters]"
    assert Call(id="b", name="tests__add", arguments="{}", status="ok", result="3").for_model() == "3"
