"""The language of a websocket: what LocaleMiddleware would pick for its handshake (cookie, then Accept-Language)."""

from __future__ import annotations

from django.conf import settings
from django.utils.translation import get_supported_language_variant
from django.utils.translation.trans_real import parse_accept_lang_header


def language_from_scope(scope: dict) -> str:
    """The settings switch's cookie if it names a language we ship, else the browser's best match, else the default."""
    cookie = (scope.get("cookies") or {}).get(settings.LANGUAGE_COOKIE_NAME)
    if cookie:
        try:
            return get_supported_language_variant(cookie)
        except LookupError:
            pass
    headers = dict(scope.get("headers") or ())
    accept = headers.get(b"accept-language", b"").decode("latin-1")
    for code, _quality in parse_accept_lang_header(accept):
        if code == "*":
            break
        try:
            return get_supported_language_variant(code)
        except LookupError:
            continue
    return get_supported_language_variant(settings.LANGUAGE_CODE)
