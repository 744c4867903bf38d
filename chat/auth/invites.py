"""Joining: invite links (made by staff, or asked for under open sign-up) and the e-mails that carry them."""

from __future__ import annotations

import logging
from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model, login, password_validation
from django.core.mail import send_mail
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from chat.models import ChatError, Invite

log = logging.getLogger(__name__)

# Open sign-up sends one link per address in this long, so the form cannot be used to flood a mailbox.
SIGNUP_RESEND_AFTER = timedelta(minutes=10)


def send_invite(invite: Invite, secret: str) -> None:
    """E-mail the invite link to its address (through the configured backend)."""
    days = max(1, round((invite.expires - timezone.now()) / timedelta(days=1)))
    send_mail(
        _("Your invitation to the team chat"),
        ngettext(
            "You are invited to the team chat.\n\nChoose your password here (the link works once, "
            "for %(days)s day):\n\n%(link)s\n\nThen sign in with this e-mail address, %(email)s, and that password.\n",
            "You are invited to the team chat.\n\nChoose your password here (the link works once, "
            "for %(days)s days):\n\n%(link)s\n\nThen sign in with this e-mail address, %(email)s, and that password.\n",
            days,
        )
        % {"days": days, "link": Invite.link(secret), "email": invite.email},
        None,
        [invite.email],
    )


def domain_allowed(email: str) -> bool:
    """Whether open sign-up takes this address (any, unless SIGNUP_DOMAINS names its domain's)."""
    domain = email.rpartition("@")[2].lower()
    return not settings.SIGNUP_DOMAINS or domain in settings.SIGNUP_DOMAINS


class ChoosePasswordForm(forms.Form):
    password1 = forms.CharField(
        label=gettext_lazy("Password"),
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text=password_validation.password_validators_help_text_html(),
    )
    password2 = forms.CharField(
        label=gettext_lazy("Password again"),
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def __init__(self, email: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.email = email

    def clean(self):
        data = super().clean()
        first, second = data.get("password1"), data.get("password2")
        if first and second and first != second:
            self.add_error("password2", _("The two passwords differ."))
        elif first:
            # The rules of a password change, judged against the account about to be made.
            would_be = get_user_model()(username=self.email, email=self.email)
            try:
                password_validation.validate_password(first, would_be)
            except forms.ValidationError as exc:
                self.add_error("password1", exc)
        return data


def accept(request, secret: str):
    """The invite link: choose a password, and the account is made and signed in."""
    invite = Invite.objects.for_secret(secret)
    if invite is None or not settings.AUTH_PASSWORD_LOGIN:  # no passwords here: sign in through the provider
        return render(request, "registration/invite_invalid.html", status=410)
    form = ChoosePasswordForm(invite.email, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = invite.accept(form.cleaned_data["password1"])
        except ChatError as exc:
            return render(request, "registration/invite_invalid.html", {"error": exc.detail}, status=410)
        login(request, user, backend="chat.auth.signin.BoundedModelBackend")
        return redirect("index")
    return render(request, "registration/invite_accept.html", {"form": form, "email": invite.email})


class SignupForm(forms.Form):
    email = forms.EmailField(
        label=gettext_lazy("E-mail address"), widget=forms.EmailInput(attrs={"autocomplete": "email"})
    )

    def clean_email(self) -> str:
        email = get_user_model().objects.normalize_email(self.cleaned_data["email"].strip())
        if not domain_allowed(email):
            raise forms.ValidationError(
                _("Sign-up is open to addresses at %(domains)s only.") % {"domains": ", ".join(settings.SIGNUP_DOMAINS)}
            )
        return email


def signup(request):
    """Open sign-up (SIGNUP_OPEN): an invite link is e-mailed, so only the address's owner can use it."""
    if not (settings.SIGNUP_OPEN and settings.AUTH_PASSWORD_LOGIN):
        return render(request, "registration/signup_closed.html", status=404)
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        email = form.cleaned_data["email"]
        recent = Invite.objects.usable().filter(email__iexact=email, created__gt=timezone.now() - SIGNUP_RESEND_AFTER)
        # The same answer whether or not the address has an account: the page must not tell who does.
        if not recent.exists():
            try:
                send_invite(*Invite.issue(email))
            except ChatError:
                log.info("sign-up asked for an address that has an account")
            except OSError as exc:  # smtplib's errors included: the mail server is down or refused it
                log.error("could not e-mail a sign-up invite: %r", exc)
                form.add_error(None, _("The e-mail could not be sent just now; please try again later."))
                return render(request, "registration/signup.html", {"form": form}, status=503)
        return render(request, "registration/signup_sent.html", {"email": email})
    return render(request, "registration/signup.html", {"form": form})


def sign_in_options(request) -> dict:
    """Template context: which ways in the sign-in page offers."""
    return {
        "signup_open": settings.SIGNUP_OPEN and settings.AUTH_PASSWORD_LOGIN,
        "password_login": settings.AUTH_PASSWORD_LOGIN,
        "sso_name": settings.OIDC_NAME if settings.OIDC_ISSUER else "",
    }
