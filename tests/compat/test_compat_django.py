"""What chat/compat/django.py relies on in Django still holds: these fail when an upgrade changes it."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.utils.deprecation import MiddlewareMixin

from chat.compat.django import OnTheLoop, is_hook_middleware, middleware_resolved_by
from tests.upstream_source import assert_unchanged

RELIED_ON_BY = "chat/compat/django.py"


async def _next_layer(request):
    return None


def test_on_the_loop_is_middleware_mixins_call_without_its_threads():
    # OnTheLoop.__acall__ is MiddlewareMixin.__acall__ with the sync_to_async hand-offs taken out.
    assert_unchanged(MiddlewareMixin.__acall__, "adf8cbcaf9f11e45", RELIED_ON_BY)
    assert_unchanged(MiddlewareMixin.__call__, "337be048dd62e014", RELIED_ON_BY)
    # ...and reads the async_mode MiddlewareMixin's __init__ sets for an async next layer.
    assert_unchanged(MiddlewareMixin.__init__, "cd0d3fd41f9408eb", RELIED_ON_BY)
    assert MiddlewareMixin(_next_layer).async_mode is True
    assert MiddlewareMixin(lambda request: None).async_mode is False


async def test_on_the_loop_runs_the_hooks_inline_in_async_mode():
    import threading

    seen = []

    class Hooks(OnTheLoop, MiddlewareMixin):
        def process_request(self, request):
            seen.append(threading.current_thread())

        def process_view(self, request, view, args, kwargs):
            seen.append(threading.current_thread())

        def process_response(self, request, response):
            seen.append(threading.current_thread())
            return response

    hooks = Hooks(_next_layer)
    await hooks(object())
    await hooks.process_view(object(), None, (), {})
    assert seen == [threading.current_thread()] * 3


def test_hook_middleware_is_known_by_middleware_mixins_own_call():
    class Plain(MiddlewareMixin):
        def process_request(self, request):
            return None

    class Inline(OnTheLoop, MiddlewareMixin):
        pass

    class Wrapping(MiddlewareMixin):
        def __call__(self, request):
            return super().__call__(request)

    assert is_hook_middleware(Plain(_next_layer)) and is_hook_middleware(Inline(_next_layer))
    assert not is_hook_middleware(Wrapping(_next_layer))
    assert not is_hook_middleware(_next_layer)  # a function middleware


def test_load_middleware_imports_each_entry_through_the_module_name_that_is_swapped():
    assert_unchanged(base.BaseHandler.load_middleware, "a1fb7ee5f8586195", RELIED_ON_BY)
    imported = base.import_string
    asked = []

    def resolve(path):
        asked.append(path)
        return imported(path)

    with middleware_resolved_by(resolve):
        base.BaseHandler().load_middleware(is_async=True)
    assert asked == list(reversed(settings.MIDDLEWARE))
    assert base.import_string is imported  # put back


def test_the_swap_is_undone_when_loading_fails():
    imported = base.import_string

    def refuse(path):
        raise ImportError(path)

    with pytest.raises(ImportError), middleware_resolved_by(refuse):
        base.BaseHandler().load_middleware(is_async=True)
    assert base.import_string is imported


def test_serve_view_uses_the_asgi_handlers_pieces_as_it_has_them():
    # serve_view answers as ASGIHandler.handle does, from the pieces below; tests/chatsite/test_completions.py
    # compares its answers with Django's byte for byte.
    assert_unchanged(ASGIHandler.handle, "98faeb5bef800331", RELIED_ON_BY)
    assert_unchanged(ASGIHandler.read_body, "cf4aa904631d5410", RELIED_ON_BY)
    assert_unchanged(ASGIHandler.create_request, "5eae59c6696013ff", RELIED_ON_BY)
    assert_unchanged(ASGIHandler.send_response, "77eda2b08689b44e", RELIED_ON_BY)
    assert_unchanged(get_script_prefix, "bd6e761a557ee4c5", RELIED_ON_BY)
