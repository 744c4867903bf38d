"""/usage/: the usage dashboard (everyone's for those who may view usage, else one's own) and its CSV download."""

from __future__ import annotations

import csv
from itertools import islice

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from chat.metering import dashboard, tool_usage

CSV_CHUNK = 2000


class Line:
    """A file-like object whose write() returns the line, so csv.writer makes strings to stream."""

    def write(self, value: str) -> str:
        return value


@never_cache
@login_required
@require_GET
def usage(request):
    """The dashboard for the period and filters in the query string."""
    context = {
        "presets": dashboard.PRESETS,
        "sources": dashboard.Usage.Source.choices,
        "query": request.GET,
        "staff": dashboard.sees_everyone(request.user),  # "Usage" or "My usage", on a refused filter's page too
        **dashboard.choices(request.user),
    }
    try:
        filters = dashboard.parse_filters(request.GET, request.user)
    except dashboard.FilterError as exc:
        return render(request, "usage/dashboard.html", {**context, "problem": exc.detail}, status=exc.status)
    figures = dashboard.figures(filters)
    context.update(
        filters=filters,
        figures=figures,
        model_choices=dashboard.model_choices(filters, figures),
        unpriced=any(not model["priced"] for model in figures.models),
        tool_calls=tool_usage.tool_counts(filters),
        csv_query=request.GET.urlencode(),
    )
    return render(request, "usage/dashboard.html", context)


@never_cache
@login_required
@require_GET
def usage_csv(request):
    """Every usage row behind the filters, streamed as CSV: a million rows never sit in memory."""
    try:
        filters = dashboard.parse_filters(request.GET, request.user)
    except dashboard.FilterError as exc:
        return HttpResponse(exc.detail, status=exc.status, content_type="text/plain; charset=utf-8")
    name = f"usage-{filters.first.isoformat()}-to-{filters.last.isoformat()}.csv"
    response = StreamingHttpResponse(csv_lines(filters), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


async def csv_lines(filters: dashboard.Filters):
    """The header, then the rows a chunk at a time, each chunk read and formatted in a worker thread.

    An async iterator because under ASGI Django reads a sync one whole into a list first; not
    QuerySet.aiterator(), which runs a values_list() query on the event loop and is refused.
    """
    writer = csv.writer(Line())
    yield writer.writerow(dashboard.CSV_COLUMNS.values())
    rows = dashboard.csv_rows(filters).iterator(chunk_size=CSV_CHUNK)  # a generator: no query yet
    while chunk := await sync_to_async(csv_chunk)(rows, writer):
        yield chunk


def csv_chunk(rows, writer) -> str:
    return "".join(writer.writerow([dashboard.csv_cell(v) for v in row]) for row in islice(rows, CSV_CHUNK))
