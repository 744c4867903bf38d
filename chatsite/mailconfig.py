"""E-mail settings from one URL (EMAIL_URL), the way DATABASE_URL gives the database's.

    smtp://user:password@mail.example.com:587?tls=1   SMTP with STARTTLS (also smtp+tls://)
    smtps://user:password@mail.example.com:465        SMTP over TLS
    smtp://127.0.0.1:25                                plain SMTP (a local relay)
    console://                                         print each message (the default)
    file:///var/mail/chat                              one file per message in that folder
    locmem://, dummy://                                keep in memory (tests) / drop

User and password are URL-encoded (a `@` in a password is `%40`).
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

BACKENDS = {
    "smtp": "django.core.mail.backends.smtp.EmailBackend",
    "smtps": "django.core.mail.backends.smtp.EmailBackend",
    "smtp+tls": "django.core.mail.backends.smtp.EmailBackend",
    "console": "django.core.mail.backends.console.EmailBackend",
    "file": "django.core.mail.backends.filebased.EmailBackend",
    "locmem": "django.core.mail.backends.locmem.EmailBackend",
    "dummy": "django.core.mail.backends.dummy.EmailBackend",
}
TRUE = {"1", "true", "yes", "on"}


def parse(url: str) -> dict[str, object]:
    """The EMAIL_* Django settings an EMAIL_URL stands for; a ValueError names what is wrong."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in BACKENDS:
        raise ValueError(f"EMAIL_URL: unknown scheme {parts.scheme!r} (one of {', '.join(BACKENDS)})")
    settings: dict[str, object] = {"EMAIL_BACKEND": BACKENDS[scheme]}
    if scheme == "file":
        settings["EMAIL_FILE_PATH"] = unquote(parts.path)
    elif scheme.startswith("smtp"):
        query = {name: values[-1].lower() for name, values in parse_qs(parts.query).items()}
        ssl = scheme == "smtps" or query.get("ssl") in TRUE
        settings.update(
            EMAIL_HOST=parts.hostname or "localhost",
            EMAIL_PORT=parts.port or (465 if ssl else 587 if scheme == "smtp+tls" else 25),
            EMAIL_HOST_USER=unquote(parts.username or ""),
            EMAIL_HOST_PASSWORD=unquote(parts.password or ""),
            EMAIL_USE_SSL=ssl,
            EMAIL_USE_TLS=not ssl and (scheme == "smtp+tls" or query.get("tls") in TRUE),
        )
    return settings
