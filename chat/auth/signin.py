"""Sign-in under attack: locked-out answers (django-axes), the client's address, and bounded password hashing.

A password hash costs about half a second of a core. Under ASGI each request runs its
sync view on a thread of its own, so a flood of clients posting wrong passwords would hash
on as many threads at once and take every core from everyone else's pages. Sign-in POSTs
therefore run on a small pool of their own, at most AUTH_HASH_CONCURRENCY at once
(by default one core fewer than the machine has), and one that cannot get a turn
within AUTH_HASH_WAIT is told the server is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import threading
import unicodedata
import weakref
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from chat.lib.key_turns import KeyTurns

BUSY = gettext_noop("The server is busy checking other sign-ins. Please try again in a moment.")


class HashStats:
    """How many password checks run now, and the most that ever ran at once (for tests and logs)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0

    def enter(self) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


hash_stats = HashStats()
_hash_slots = threading.BoundedSemaphore(settings.AUTH_HASH_CONCURRENCY)


class LockoutBackend(AxesStandaloneBackend):
    """django-axes' lockout check for sign-ins over HTTP; code that calls authenticate() with no request
    (a management command, a test) is not a client to throttle, and axes would refuse it outright."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        """Refuse a locked-out account or address before any password is hashed."""
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class BoundedModelBackend(ModelBackend):
    """Django's backend, with at most AUTH_HASH_CONCURRENCY password checks at once in this process."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        """Check the password once a hashing slot is free; a ValidationError (shown on the form) if none is."""
        if not _hash_slots.acquire(timeout=settings.AUTH_HASH_WAIT):
            # Not PermissionDenied: that would count as a failed sign-in towards the lockout.
            raise ValidationError(_(BUSY), code="busy")
        hash_stats.enter()
        try:
            return super().authenticate(request, username=username_for(username), password=password, **kwargs)
        finally:
            hash_stats.leave()
            _hash_slots.release()


def username_for(login: str | None) -> str | None:
    """The username someone signs in as: their username, or the e-mail address of exactly one account."""
    if not login or "@" not in login:
        return login
    users = get_user_model()._default_manager
    if users.filter(username=login).exists():
        return login
    found = list(users.filter(email__iexact=login).values_list("username", flat=True)[:2])
    return found[0] if len(found) == 1 else login


def lockout_username(request: HttpRequest, credentials: dict | None = None) -> str | None:
    """The name failed sign-ins are counted under (AXES_USERNAME_CALLABLE): the account's own username,
    whatever spelling of it or of its e-mail address was typed, so each spelling gets no tries of its own."""
    if credentials:
        login = credentials.get("username")
    else:
        login = getattr(request, "data", request.POST).get("username")
    if not login or not isinstance(login, str):
        return login
    users = get_user_model()._default_manager
    if users.filter(username=login).exists():
        return login
    found = list(users.filter(username__iexact=login).values_list("username", flat=True)[:2])
    if len(found) == 1:
        return found[0]
    account = username_for(login)
    if account != login:
        return account
    return login.casefold() if "@" in login else login


_pool = ThreadPoolExecutor(max_workers=settings.AUTH_HASH_CONCURRENCY, thread_name_prefix="sign-in")
_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _turn() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _turns:
        _turns[loop] = asyncio.Semaphore(settings.AUTH_HASH_CONCURRENCY)
    return _turns[loop]


# Each typed login's sign-ins one at a time, so that one person's flood of posts (even with the right password,
# which locks nothing out) waits behind itself rather than taking every turn from the others.
_logins = KeyTurns()


def login_key(login: object) -> str:
    """The typed login as its spellings share it (case, spaces, full-width letters): an account has two, its
    username and its e-mail address."""
    return unicodedata.normalize("NFKC", login).strip().casefold() if isinstance(login, str) else ""


def sign_in_view(view):
    """Run a sign-in view's POSTs on the sign-in pool, so hashing never holds up other requests."""

    def run(request, *args, **kwargs):
        close_old_connections()  # a pool thread keeps its own connection, like a request thread
        try:
            response = view(request, *args, **kwargs)
            if callable(getattr(response, "render", None)):
                response = response.render()
            return response
        finally:
            close_old_connections()

    @functools.wraps(view)
    async def wrapper(request, *args, **kwargs):
        if request.method != "POST":
            return await sync_to_async(run)(request, *args, **kwargs)
        turn = _turn()
        async with contextlib.AsyncExitStack() as held:
            try:
                async with asyncio.timeout(settings.AUTH_HASH_WAIT):
                    key = login_key(request.POST.get("username"))  # the sign-in form's (an invite's has none)
                    if key:
                        await held.enter_async_context(_logins.turn(key))
                    await turn.acquire()
            except TimeoutError:
                return await sync_to_async(login_page)(request, _(BUSY), 503)
            try:
                return await sync_to_async(run, thread_sensitive=False, executor=_pool)(request, *args, **kwargs)
            finally:
                turn.release()

    return wrapper


def login_page(request: HttpRequest, error: str, status: int) -> HttpResponse:
    """The sign-in form again, with a sentence saying why it was refused."""
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    next_url = request.POST.get("next") or request.GET.get("next") or ""
    if not next_url and request.path.startswith("/admin/"):
        next_url = "/admin/"
    return render(request, "registration/login.html", {"form": form, "error": error, "next": next_url}, status=status)


def lockout_message() -> str:
    minutes = settings.AUTH_LOCKOUT_MINUTES
    return ngettext(
        "Too many failed sign-ins for this account or from this address. "
        "Please wait %(minutes)s minute and try again, or ask an administrator to unlock it.",
        "Too many failed sign-ins for this account or from this address. "
        "Please wait %(minutes)s minutes and try again, or ask an administrator to unlock it.",
        minutes,
    ) % {"minutes": minutes}


def lockout_response(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    """What django-axes answers a locked-out sign-in (the page's and the admin's): the form and the wait."""
    return login_page(request, lockout_message(), 429)


@functools.cache
def _trusted_networks() -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in settings.TRUSTED_PROXIES)


def _is_trusted_proxy(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in _trusted_networks())


def client_ip(request: HttpRequest) -> str:
    """The address sign-ins are throttled under: the TCP peer, or behind DJANGO_TRUSTED_PROXIES the
    right-most X-Forwarded-For entry that is not one of them (the left part is the client's to forge)."""
    peer = request.META.get("REMOTE_ADDR") or ""
    if _is_trusted_proxy(peer):
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
        for hop in reversed(hops):
            if not _is_trusted_proxy(hop):
                return hop
    return peer
