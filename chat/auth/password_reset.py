"""The "Forgot your password?" form: Django's, with at most one e-mail an address in a while."""

from __future__ import annotations

import logging

from django.contrib.auth import forms as auth_forms
from django.core.cache import cache

log = logging.getLogger(__name__)

# The form is open to anyone, who could otherwise fill a person's inbox with links. Counted in the
# process's cache (each server process keeps its own unless CACHES names a shared one).
RESEND_AFTER_SECONDS = 10 * 60


class PasswordResetForm(auth_forms.PasswordResetForm):
    """Django's form, sending an address a link at most once every RESEND_AFTER_SECONDS."""

    def send_mail(self, subject_template_name, email_template_name, context, from_email, to_email,
                  html_email_template_name=None) -> None:  # fmt: skip
        if not cache.add(f"chat:password-reset:{to_email.lower()}", True, RESEND_AFTER_SECONDS):
            log.info("password reset: a link went to this address less than %d minutes ago; not sent again",
                     RESEND_AFTER_SECONDS // 60)  # fmt: skip
            return
        super().send_mail(subject_template_name, email_template_name, context, from_email, to_email,
                          html_email_template_name)  # fmt: skip
