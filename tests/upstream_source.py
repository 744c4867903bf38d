"""Fingerprints of library code that chat/compat copies or goes around, to notice an upgrade that changes it."""

from __future__ import annotations

import hashlib
import inspect


def fingerprint(obj) -> str:
    """The first 16 hex digits of the SHA-256 of `obj`'s source as the installed library has it."""
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def assert_unchanged(obj, expected: str, relied_on_by: str) -> None:
    """Fail, naming what to re-read, when `obj`'s source is no longer the one `relied_on_by` was written against."""
    found = fingerprint(obj)
    name = f"{obj.__module__}.{obj.__qualname__}"
    assert found == expected, (
        f"{name} changed upstream (fingerprint {found}, was {expected}): re-read it against {relied_on_by}, "
        "then update the module's docstring (versions) and this fingerprint"
    )
