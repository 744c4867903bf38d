"""Number formats and choice lists for the usage dashboard."""

from django import template
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def percent(value) -> str:
    """A share (0.25) as a percentage ("25.0 %"); an empty cell for none."""
    if value is None or value == "":
        return "–"
    return f"{float(value) * 100:.1f} %"


@register.filter
def usd(value, places: int = 4) -> str:
    """A cost in dollars with thousands separators ("$1,234.5000"); `places` below 4 only from a dollar up."""
    if value is None:
        return "–"
    if int(places) < 4 and 0 < abs(float(value)) < 1:
        places = 4  # a sum under a dollar would read as $0.00 beside the rows it adds up
    return f"${float(value):,.{int(places)}f}"


@register.filter
def whole(value) -> str:
    """A count with thousands separators; an empty cell for none."""
    if value is None:
        return "–"
    return f"{round(float(value)):,}"


@register.filter
def sortvalue(value) -> str:
    """The raw number a sortable column orders by (empty sorts first)."""
    return "" if value is None else str(value)


@register.simple_tag
def options(choices, selected) -> str:
    """<option>s for (id, label) pairs, the one whose id is `selected` (a query string value) selected.

    One call rather than a template loop: the person filter of a big team has hundreds.
    """
    chosen = str(selected or "")
    return format_html_join(
        "",
        '<option value="{}"{}>{}</option>',
        ((value, mark_safe(" selected") if str(value) == chosen else "", label) for value, label in choices),
    )
