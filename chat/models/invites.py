"""Invites: a single-use, expiring link with which a person chooses a password and signs in with their e-mail."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from chat.models.base import ChatError


class InviteQuerySet(models.QuerySet):
    def usable(self):
        """Not used yet and not expired."""
        return self.filter(used__isnull=True, expires__gt=timezone.now())

    def for_secret(self, secret: str) -> Invite | None:
        """The usable invite with this secret; only its hash is stored."""
        return self.usable().filter(digest=Invite.digest_of(secret)).first()


def account_exists(email: str) -> bool:
    """Whether someone already signs in with this address (as their username or their e-mail)."""
    users = get_user_model().objects
    return users.filter(username__iexact=email).exists() or users.filter(email__iexact=email).exists()


class Invite(models.Model):
    """An invitation for one e-mail address; the link carries a secret of which only the hash is kept."""

    email = models.EmailField()
    digest = models.CharField(max_length=64, unique=True, editable=False)
    staff = models.BooleanField("staff", default=False, help_text="The account may use the admin.")
    groups = models.ManyToManyField(Group, blank=True, help_text="The account joins these groups.")
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    expires = models.DateTimeField()
    used = models.DateTimeField(null=True, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
        help_text="The account made with it.",
    )  # fmt: skip

    objects = InviteQuerySet.as_manager()
    replaced = 0  # once saved: how many waiting invites for the address this one withdrew (withdraw_waiting)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return self.email

    @staticmethod
    def digest_of(secret: str) -> str:
        # The secret is 256 random bits: a fast hash is enough, unlike for passwords.
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def issue(cls, email: str, *, staff: bool = False, groups=(), by=None) -> tuple[Invite, str]:
        """A new invite and its secret (for the link), expiring after INVITE_DAYS; refused for a known address."""
        email = get_user_model().objects.normalize_email(email.strip())
        try:
            validate_email(email)  # the admin's form checks it too; `manage.py invite` did not
        except ValidationError:
            raise ChatError("bad_email", _("%(email)s is not an e-mail address.") % {"email": email}) from None
        if account_exists(email):
            raise ChatError("exists", _("%(email)s already has an account.") % {"email": email})
        invite = cls(email=email, staff=staff, created_by=by)
        secret = invite.new_secret()
        with transaction.atomic():
            invite.replaced = cls.withdraw_waiting(email)
            invite.save()
            invite.groups.set(groups)
        return invite, secret

    @classmethod
    def withdraw_waiting(cls, email: str, keep: int | None = None) -> int:
        """End the usable invites for `email` but `keep` (a new link replaces them: one link, one set of groups);
        how many."""
        return cls.objects.usable().filter(email__iexact=email).exclude(pk=keep).update(expires=timezone.now())

    def new_secret(self) -> str:
        """A new secret for the link (an earlier link stops working once saved), valid INVITE_DAYS from now."""
        secret = secrets.token_urlsafe(32)
        self.digest = self.digest_of(secret)
        self.expires = timezone.now() + timedelta(days=settings.INVITE_DAYS)
        return secret

    @staticmethod
    def link(secret: str) -> str:
        """The invite's address, to print or send."""
        return f"{settings.SITE_URL}/accounts/invite/{secret}/"

    def accept(self, password: str):
        """Make the account (username and e-mail: the invited address) and use the invite up; once only."""
        with transaction.atomic():
            # Locked, so two tabs posting the same link make one account.
            invite = Invite.objects.usable().select_for_update().filter(pk=self.pk).first()
            if invite is None:
                raise ChatError("used", _("This invite has expired or was already used."))
            if account_exists(invite.email):
                raise ChatError(
                    "exists", _("%(email)s already has an account; sign in instead.") % {"email": invite.email}
                )
            user = get_user_model().objects.create_user(
                invite.email, email=invite.email, password=password, is_staff=invite.staff
            )
            user.groups.set(invite.groups.all())
            invite.used, invite.user = timezone.now(), user
            invite.save(update_fields=["used", "user"])
        return user
