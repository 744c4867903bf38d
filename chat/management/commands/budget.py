"""Show or set a user's monthly budget; the last line printed is the budget, spent and remaining."""

from decimal import Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chat.metering.budgets import Budget, budget_for, summary


def amount(value: str) -> Decimal:
    try:
        usd = Decimal(value)
    except InvalidOperation:
        raise CommandError(f"--usd must be an amount of USD such as 25 or 12.50, not {value!r}.") from None
    # The range first: quantize() of 1e30 overflows the context's precision (InvalidOperation).
    if not usd.is_finite() or usd < 0 or usd >= 10**10 or usd != usd.quantize(Decimal("0.01")):
        raise CommandError(f"--usd must be 0 or more, in whole cents, below 10,000,000,000, not {value!r}.")
    return usd


def count(value: str) -> int:
    try:
        tokens = int(value)
    except ValueError:
        raise CommandError(f"--tokens must be a whole number of tokens, not {value!r}.") from None
    if not 0 <= tokens < 2**63:
        raise CommandError(f"--tokens must be 0 or more and below 2**63, not {value!r}.")
    return tokens


class Command(BaseCommand):
    help = (
        "Print USERNAME's monthly budget, spent and remaining (last line). --usd/--tokens set the user's own "
        "budget (`none` for no limit of that kind), --clear removes it (back to the group's or the default)."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--usd", help="USD a month, or `none`")
        parser.add_argument("--tokens", help="tokens a month, or `none`")
        parser.add_argument("--clear", action="store_true", help="remove the user's own budget")

    def handle(self, *args, username, usd, tokens, clear, **options):
        try:
            user = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        if clear and (usd is not None or tokens is not None):
            raise CommandError("--clear removes the budget; it cannot be combined with --usd or --tokens.")
        if clear:
            Budget.objects.filter(user=user).delete()
        elif usd is not None or tokens is not None:
            # A new own budget starts from the inherited one, so setting one kind keeps the other.
            inherited = budget_for(user)
            budget, _ = Budget.objects.get_or_create(
                user=user, defaults={"usd": inherited.usd, "tokens": inherited.tokens}
            )
            if usd is not None:
                budget.usd = None if usd.lower() == "none" else amount(usd)
            if tokens is not None:
                budget.tokens = None if tokens.lower() == "none" else count(tokens)
            budget.save()
        self.stdout.write(line(user))


def line(user) -> str:
    """One line for scripts: budget, spent (incl. running reservations) and remaining, USD then tokens."""
    month = summary(user)
    usd, tokens = month["usd"], month["tokens"]

    def pair(key: str) -> str:
        money = "no USD limit" if usd[key] is None else f"${Decimal(usd[key]).normalize():f}"
        count = "no token limit" if tokens[key] is None else f"{tokens[key]} tokens"
        return f"{money}, {count}"

    return (
        f"{user.get_username()} ({month['source']} budget, month from {month['since'][:10]}): "
        f"budget {pair('limit')}; spent ${Decimal(usd['spent']).normalize():f}, {tokens['spent']} tokens; "
        f"remaining {pair('remaining')}"
    )
