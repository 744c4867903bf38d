"""A request's path as the logs may show it: the capability secrets some paths carry replaced."""

from __future__ import annotations

import re

# Whoever holds one of these paths gets in: an invite, a password reset, a share link.
_SECRETS = re.compile(
    r"^(?P<keep>/accounts/invite/|/accounts/password/reset/[^/]+/(?!set-password/)|/s/)(?P<secret>[^/]+)"
)


def loggable_path(path: str) -> str:
    """`path` with an invite's, a password reset's or a share's secret shown as `[secret]`."""
    return _SECRETS.sub(r"\g<keep>[secret]", path, count=1)
