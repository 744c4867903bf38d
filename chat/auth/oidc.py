"""OpenID Connect single sign-on through mozilla-django-oidc, configured by OIDC_* settings.

The provider is named by its issuer URL alone: its endpoints come from the issuer's
discovery document, fetched when someone first signs in with it (never at start-up or
on a password sign-in, so a provider that is down only stops its own sign-ins). The
user is found by the claim OIDC_USERNAME_CLAIM names (their username here), made on
first sign-in if OIDC_CREATE_USERS, and refused unless their e-mail is at one of
OIDC_ALLOWED_DOMAINS when that list is set.
"""

from __future__ import annotations

import logging
import time

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.shortcuts import redirect
from django.views import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

log = logging.getLogger(__name__)

# mozilla-django-oidc's endpoint settings -> the discovery document's fields.
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
DISCOVERY_SECONDS = 3600
_discovered: tuple[float, dict] | None = None


def discovery() -> dict:
    """The issuer's OpenID configuration, fetched once an hour at most."""
    global _discovered
    if _discovered is None or _discovered[0] < time.monotonic():
        url = settings.OIDC_ISSUER.rstrip("/") + "/.well-known/openid-configuration"
        answer = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        answer.raise_for_status()
        _discovered = (time.monotonic() + DISCOVERY_SECONDS, answer.json())
    return _discovered[1]


def get_setting(attr: str, *default):
    """A setting as mozilla-django-oidc asks for it; the provider's endpoints come from discovery."""
    if attr in ENDPOINTS:
        return discovery()[ENDPOINTS[attr]]
    return import_from_settings(attr, *default)


def email_allowed(email: str) -> bool:
    domain = email.rpartition("@")[2].lower()
    return not settings.OIDC_ALLOWED_DOMAINS or domain in settings.OIDC_ALLOWED_DOMAINS


class Backend(OIDCAuthenticationBackend):
    """Signs in whoever the provider vouches for, by the username claim, within the allowed domains."""

    get_settings = staticmethod(get_setting)

    def __init__(self, *args, **kwargs) -> None:
        # Not the library's: it reads the endpoints here, and Django builds every backend for
        # every sign-in, password ones too. They are looked up when used (__getattr__).
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = get_user_model()

    def __getattr__(self, name: str):
        if name in ENDPOINTS:
            return get_setting(name)
        raise AttributeError(name)

    def username_of(self, claims: dict) -> str:
        return str(claims.get(settings.OIDC_USERNAME_CLAIM) or "").strip()

    def verify_claims(self, claims: dict) -> bool:
        """A username claim, and (with OIDC_ALLOWED_DOMAINS) a verified e-mail at one of those domains."""
        email = claims.get("email") or ""
        if not self.username_of(claims):
            log.warning("single sign-on refused: no %r claim", settings.OIDC_USERNAME_CLAIM)
            return False
        if settings.OIDC_ALLOWED_DOMAINS and (not email_allowed(email) or claims.get("email_verified") is False):
            log.warning("single sign-on refused for %s: not at an allowed domain", email or "(no e-mail)")
            return False
        return True

    def filter_users_by_claims(self, claims: dict):
        return self.UserModel.objects.filter(**{self.UserModel.USERNAME_FIELD: self.username_of(claims)})

    def describe_user_by_claims(self, claims: dict) -> str:
        return f"{settings.OIDC_USERNAME_CLAIM} {self.username_of(claims)}"

    def create_user(self, claims: dict):
        """A new account with no password: it signs in through the provider only."""
        user = self.UserModel.objects.create_user(self.username_of(claims), email=claims.get("email") or "")
        log.info("single sign-on made the account %s", user.get_username())
        return user

    def update_user(self, user, claims: dict):
        """Keep the e-mail address the provider has (password resets go there); never for a local account.

        An account with a password of its own here (the first admin, an invited person) is not signed in
        from the provider, whose `admin` or other namesake would otherwise take it over.
        """
        if user.has_usable_password():
            log.warning("single sign-on refused for %s: a local account has that username", user.get_username())
            raise SuspiciousOperation("a local account has that username")  # the sign-in fails (authenticate)
        email = claims.get("email") or ""
        if email and email != user.email:
            user.email = email
            user.save(update_fields=["email"])
        return user


UNREACHABLE = (requests.RequestException, KeyError, ValueError)  # down, or an answer without what is needed


class SignInView(OIDCAuthenticationRequestView):
    """To the provider's sign-in page."""

    get_settings = staticmethod(get_setting)

    def __init__(self, **kwargs) -> None:
        View.__init__(self, **kwargs)  # not the library's: the endpoint is looked up in get()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request):
        try:
            self.OIDC_OP_AUTH_ENDPOINT = get_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except UNREACHABLE as exc:
            log.error("single sign-on: cannot read the provider's configuration: %r", exc)
            return redirect(settings.LOGIN_REDIRECT_URL_FAILURE)
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """Back from the provider: signed in, or to the sign-in page with a sentence saying it did not work."""

    get_settings = staticmethod(get_setting)

    def get(self, request):
        try:
            return super().get(request)
        except UNREACHABLE as exc:
            log.error("single sign-on: the provider did not complete the sign-in: %r", exc)
            return self.login_failure()
