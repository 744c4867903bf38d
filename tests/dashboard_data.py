"""A fixed set of usage rows for the dashboard tests, with the figures worked out by hand beside it.

`seed()` runs in the test process (SQLite) and in `manage.py shell` against a PostgreSQL
server of its own, so both backends are checked against the same numbers.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

PASSWORDS = {"alice": "alice-secret-pw", "bob": "bob-secret-pw", "carol": "carol-secret-pw"}
MARCH = {"period": "custom", "from": "2026-03-01", "to": "2026-03-31"}

# user, source, model, started (UTC), prompt, completion, reasoning, cost, ttft ms, tokens/s, status
ROWS = [
    ("alice", "chat", "model-a", (3, 1, 10, 0, 0), 100, 50, 10, "0.25", 100, 10.0, "complete"),
    ("alice", "api", "model-a", (3, 1, 12, 0, 0), 200, 100, 0, "0.5", 200, 20.0, "stopped"),
    ("bob", "chat", "model-a", (3, 2, 9, 0, 0), 300, 150, 30, "1.0", 300, 30.0, "complete"),
    ("bob", "chat", "model-a", (3, 15, 9, 0, 0), 400, 200, 0, None, 400, 40.0, "failed"),
    ("alice", "chat", "model-a", (3, 31, 23, 59, 59), 10, 5, 0, "0.125", None, None, "interrupted"),
    ("bob", "api", "model-b", (3, 2, 10, 0, 0), 1000, 500, 100, "2.0", 1000, 50.0, "complete"),
    ("carol", "chat", "model-b", (3, 10, 8, 0, 0), 50, 25, 0, "0.0625", 500, 25.0, "complete"),
    # Outside March by a second either side: in no figure of the March tests.
    ("alice", "chat", "model-a", (2, 28, 23, 59, 59), 7, 7, 0, "9.0", 7, 7.0, "complete"),
    ("bob", "chat", "model-b", (4, 1, 0, 0, 0), 7, 7, 0, "9.0", 7, 7.0, "complete"),
]

# Worked out by hand from ROWS for March (UTC).
TOTALS = {
    "requests": 7,
    "prompt_tokens": 2060,
    "completion_tokens": 1030,
    "reasoning_tokens": 140,
    "cost": Decimal("3.9375"),
    "people": 3,
}
PEOPLE = {  # requests, in, out, reasoning, cost, last active
    "alice": (3, 310, 155, 10, Decimal("0.875"), "2026-03-31T23:59:59+00:00"),
    "bob": (3, 1700, 850, 130, Decimal("3.0"), "2026-03-15T09:00:00+00:00"),
    "carol": (1, 50, 25, 0, Decimal("0.0625"), "2026-03-10T08:00:00+00:00"),
}
MODELS = {  # requests, tokens, cost, TTFT p50, TTFT p95, tokens/s p50, stopped, interrupted, failed
    # TTFT 100, 200, 300, 400 (the interrupted row has none): p50 at 1.5 -> 250, p95 at 2.85 -> 385.
    "model-a": (5, 1515, Decimal("1.875"), 250.0, 385.0, 25.0, 0.2, 0.2, 0.2),
    # TTFT 500, 1000: p50 at 0.5 -> 750, p95 at 0.95 -> 975; tokens/s 25, 50 -> 37.5.
    "model-b": (2, 1575, Decimal("2.0625"), 750.0, 975.0, 37.5, 0.0, 0.0, 0.0),
}


def seed() -> dict[str, int]:
    """Create alice and bob (bob in group "research"), carol (staff who may view usage) and ROWS; user ids by name."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    from chat.models import Usage

    User = get_user_model()
    users = {
        name: User.objects.create_user(name, password=password, is_staff=name == "carol")
        for name, password in PASSWORDS.items()
    }
    users["carol"].user_permissions.add(Permission.objects.get(codename="view_usage", content_type__app_label="chat"))
    Group.objects.create(name="research").user_set.add(users["bob"])
    Usage.objects.bulk_create(
        Usage(
            user=users[user],
            source=source,
            model=model,
            started=datetime(2026, *when, tzinfo=UTC),
            prompt_tokens=prompt,
            completion_tokens=completion,
            reasoning_tokens=reasoning,
            total_tokens=prompt + completion,
            cost=Decimal(cost) if cost is not None else None,
            ttft_ms=ttft,
            tokens_per_second=speed,
            status=status,
        )
        for user, source, model, when, prompt, completion, reasoning, cost, ttft, speed, status in ROWS
    )
    return {name: user.pk for name, user in users.items()}
