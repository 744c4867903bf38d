"""The middleware chain, kept on the event loop, and the headers on every response.

Django runs a `MiddlewareMixin` middleware under ASGI by sending each of its hooks to a
worker thread and back (`sync_to_async`), and a sync-only one (WhiteNoise's) makes it run
everything below it, the view too, through a thread. For the hooks used here that do no I/O
that is pure overhead, paid on every request and every `/v1` stream start: a thread
hand-off costs more than the hook it runs. So each is subclassed
to run inline in async mode (chat/compat/django.py's OnTheLoop); the two whose response hook
may write to the database (sessions, messages) go to a thread only when they have something
to write. Django's
security, CSRF and X-Frame-Options middleware keep their own names in settings.MIDDLEWARE
(`check --deploy` looks for those names, and without them skips its HTTPS and HSTS checks);
the server's ASGIHandler below runs subclasses of them on the loop in their place.
"""

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.core.handlers import asgi
from django.middleware import clickjacking, common, csrf, locale, security
from django.utils.cache import patch_cache_control
from django.utils.deprecation import MiddlewareMixin
from django.utils.module_loading import import_string
from whitenoise.middleware import WhiteNoiseMiddleware

from chat.compat.django import OnTheLoop, middleware_resolved_by, serve_view
from chatsite import completions

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # data: for small inline icons; images from other origins are never loaded
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# Django's admin templates carry a few style attributes; scripts stay 'self' there too.
ADMIN_POLICY = POLICY.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")


class CommonMiddleware(OnTheLoop, common.CommonMiddleware):
    pass


class LocaleMiddleware(OnTheLoop, locale.LocaleMiddleware):
    """Reads the language cookie and Accept-Language and sets Vary: no I/O, so on the loop too."""


class AuthenticationMiddleware(OnTheLoop, auth.AuthenticationMiddleware):
    """request.user stays lazy: the database is read only by a view that asks (in its own way)."""


class SessionMiddleware(OnTheLoop, sessions.SessionMiddleware):
    def response_writes(self, request) -> bool:
        session = getattr(request, "session", None)
        return session is not None and session.modified


class MessageMiddleware(OnTheLoop, messages.MessageMiddleware):
    def response_writes(self, request) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, still the static file server, without making the chain below it synchronous."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, **kwargs) -> None:
        super().__init__(get_response, **kwargs)
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        # A dict lookup (a stat of the file with DEBUG's autorefresh): cheap enough for the loop.
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)


class ContentSecurityPolicyMiddleware(OnTheLoop, MiddlewareMixin):
    def process_response(self, request, response):
        policy = ADMIN_POLICY if request.path.startswith("/admin/") else POLICY
        response.headers.setdefault("Content-Security-Policy", policy)
        return response


# Answers, conversations and usage are private: no browser, proxy or CDN may keep a copy.
PRIVATE_TYPES = ("application/json", "text/event-stream")
PRIVATE_PATHS = ("/api/", "/v1/")


class NoStoreMiddleware(OnTheLoop, MiddlewareMixin):
    """`Cache-Control: no-store` on every JSON response, every /v1 stream and everything under /api/ and /v1/."""

    def process_response(self, request, response):
        if response.get("Content-Type", "").startswith(PRIVATE_TYPES) or request.path.startswith(PRIVATE_PATHS):
            patch_cache_control(response, no_store=True)
        return response


# --- Django's security, CSRF and X-Frame-Options middleware on the loop, under their own names ---


class SecurityMiddleware(OnTheLoop, security.SecurityMiddleware):
    pass


class XFrameOptionsMiddleware(OnTheLoop, clickjacking.XFrameOptionsMiddleware):
    pass


class CsrfViewMiddleware(OnTheLoop, csrf.CsrfViewMiddleware):
    """CSRF's checks inline, but a form's token read from an unsafe request's body in a thread (it may be an upload)."""

    def inline_view(self, check):
        async def process_view(request, view, args, kwargs):
            if request.method in ("GET", "HEAD", "OPTIONS", "TRACE") or getattr(view, "csrf_exempt", False):
                return check(request, view, args, kwargs)
            return await sync_to_async(check)(request, view, args, kwargs)

        return process_view


# settings.MIDDLEWARE keeps Django's names (`check --deploy` looks for them); the server runs these.
ON_THE_LOOP = {
    "django.middleware.security.SecurityMiddleware": SecurityMiddleware,
    "django.middleware.csrf.CsrfViewMiddleware": CsrfViewMiddleware,
    "django.middleware.clickjacking.XFrameOptionsMiddleware": XFrameOptionsMiddleware,
}


def resolve(path: str):
    """A settings.MIDDLEWARE entry's class: ours on the loop for Django's three, else the entry itself."""
    return ON_THE_LOOP.get(path) or import_string(path)


# The thread of /v1's synchronous work: the request signals' receivers and closing the response.
API_SYNC_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="v1-sync")


class ASGIHandler(asgi.ASGIHandler):
    """Django's ASGI handler with Django's security, CSRF and X-Frame-Options middleware run on the event loop.

    Each of them sent every hook to a thread and back: six hand-offs per request, a few
    milliseconds of a `/v1` stream's start. Their hooks do no I/O (CSRF's token is in a
    cookie: CSRF_USE_SESSIONS is off), so they run inline like the others above.

    Django also gives every request a thread of its own for its synchronous work. /v1's views
    are async and do their database work on chat/runtime/db_threads.py's threads, so there that thread only
    ever runs the request_started and request_finished receivers and the response's close():
    starting it cost more than all of them. /v1 requests share one long-lived thread instead.
    """

    def __init__(self) -> None:
        super().__init__()
        # /v1/chat/completions past the handler's machinery (chatsite/completions.py), unless a
        # middleware it does not know is configured.
        self.completions_chain = completions.chain(resolve)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == completions.PATH and self.completions_chain is not None:
            return await serve_view(self, self.completions_chain, completions.view, scope, receive, send)
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            async with ThreadSensitiveContext(executor=API_SYNC_THREAD):
                return await super().__call__(scope, receive, send)
        return await super().__call__(scope, receive, send)

    def load_middleware(self, is_async: bool = False) -> None:
        if not is_async or settings.CSRF_USE_SESSIONS:
            return super().load_middleware(is_async)
        # load_middleware imports each entry of settings.MIDDLEWARE by name: only the three change.
        with middleware_resolved_by(resolve):
            super().load_middleware(is_async)
