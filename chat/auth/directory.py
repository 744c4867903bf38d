"""LDAP sign-in (django-auth-ldap, on with LDAP_SERVER_URI): accounts made from the directory, never a local one."""

from __future__ import annotations

import logging

from django_auth_ldap.backend import LDAPBackend

from chat.auth.signin import username_for

log = logging.getLogger(__name__)


class DirectoryBackend(LDAPBackend):
    """django-auth-ldap's backend, which signs a directory entry in only as an account the directory made.

    An account with a password of its own here (the first admin, an invited person) is a local one: a
    directory entry of the same name (FreeIPA makes `uid=admin`) must not sign in as it, nor rewrite its
    e-mail address, to which its password resets go. Accounts made from the directory have no usable password.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        """As the form's other backends: a username, or the e-mail address of exactly one account."""
        return super().authenticate(request, username=username_for(username), password=password, **kwargs)

    def get_or_build_user(self, username, ldap_user):
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and user.has_usable_password():
            log.warning("LDAP sign-in refused for %s: a local account has that username", username)
            raise ldap_user.AuthenticationFailed("a local account has that username")
        return user, built
