"""Which provider and model a request names: every enabled provider's models (the catalog), read against a
person's access (chat/models/access.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from django.utils.translation import gettext as _

from chat.models.access import Access, access_of
from chat.models.base import ChatError
from chat.models.providers import Provider
from chat.runtime import db_threads
from chat.streaming.providers import cached_model_ids, model_ids

R = TypeVar("R")


@dataclass(frozen=True)
class CatalogEntry:
    provider: Provider
    model: str

    @property
    def qualified(self) -> str:
        return f"{self.provider.name}/{self.model}"


async def load_catalog(access: Access | None = None, *, providers: list | None = None) -> list[CatalogEntry]:
    """Every (provider, model) pair of the enabled providers, in provider order; with `access`, its own.

    `providers`: enabled_list() as the caller read it already, in a trip to a database thread of its own.
    """
    if providers is None:
        providers = await db_threads.run(Provider.objects.enabled_list)()
    lists = await asyncio.gather(*(model_ids(p) for p in providers))
    catalog = [CatalogEntry(p, m) for p, ids in zip(providers, lists, strict=True) for m in ids]
    if access is not None:
        catalog = [entry for entry in catalog if access.allows(entry.provider.pk, entry.model)]
    return catalog


async def resolve_model(
    model: str | None, access: Access | None = None, *, providers: list | None = None
) -> CatalogEntry:
    """The provider and model id for a requested model (plain, or `provider/model`); see resolve_in()."""
    return resolve_in(await load_catalog(providers=providers), model, access)


class ModelListNotCached(Exception):
    """A provider's model list is not cached in this process: it must be fetched, on the event loop, first."""

    def __init__(self, providers: list[Provider]) -> None:
        super().__init__("a provider's model list is not cached")
        self.providers = providers


def cached_catalog(providers: list[Provider]) -> list[CatalogEntry]:
    """load_catalog() from the model lists this process holds, with no I/O: for a database thread's use.

    Raises ModelListNotCached if a list is missing or stale; the caller awaits load_catalog() and tries again with it.
    """
    catalog = []
    for provider in providers:
        ids = cached_model_ids(provider)
        if ids is None:
            raise ModelListNotCached(providers)
        catalog.extend(CatalogEntry(provider, model) for model in ids)
    return catalog


def catalog_of(providers: list[Provider], fetched: list[CatalogEntry] | None) -> list[CatalogEntry]:
    """What a start resolves its model in: cached_catalog() of the enabled `providers` it just read, or the catalog
    its caller `fetched` (with_catalog) cut to those providers, as they are now: one disabled or changed (its key,
    its address) while the lists were fetched is not used as it was."""
    if fetched is None:
        return cached_catalog(providers)
    current = {provider.pk: provider for provider in providers}
    return [CatalogEntry(current[entry.provider.pk], entry.model) for entry in fetched if entry.provider.pk in current]


async def with_catalog(opening: Callable[[list[CatalogEntry] | None], Awaitable[R]]) -> R:
    """`await opening(None)`, which resolves from cached_catalog(); if a list is not held, fetch it and call again."""
    try:
        return await opening(None)
    except ModelListNotCached as cold:  # a provider's model list, not fetched yet in this process or expired
        return await opening(await load_catalog(providers=cold.providers))


def resolve_in(catalog: list[CatalogEntry], model: str | None, access: Access | None = None) -> CatalogEntry:
    """The entry of `catalog` (every enabled provider's models) that a requested model names.

    With `access` (chat/models/access.py), a model that person may not use is refused
    (`model_not_allowed`), and no model means their group's default, else the site's.
    """
    if not catalog:
        raise ChatError("no_provider", _("No upstream provider is enabled."))
    if not model:
        return default_entry(catalog, access)
    entry = find(catalog, model, access)
    if entry is None:
        raise ChatError("unknown_model", _("Unknown model %(model)r.") % {"model": model})
    if access is not None and not access.allows(entry.provider.pk, entry.model):
        raise ChatError(
            "model_not_allowed", _("You may not use the model %(model)r; ask an administrator.") % {"model": model}
        )
    return entry


def find(catalog: list[CatalogEntry], model: str, access: Access | None = None) -> CatalogEntry | None:
    """The entry a plain id or a `provider/model` id names.

    A plain id is the first provider's that lists it, among those `access` lets the person use if any
    does: the provider GET /v1/models shows them under that id.
    """
    plain = [entry for entry in catalog if entry.model == model]
    allowed = [entry for entry in plain if access is None or access.allows(entry.provider.pk, entry.model)]
    if plain:
        return (allowed or plain)[0]
    return next((entry for entry in catalog if entry.qualified == model), None)


def default_entry(catalog: list[CatalogEntry], access: Access | None = None) -> CatalogEntry:
    """What a request naming no model gets: the group's default, the first provider's, or the first allowed.

    The first provider that is not the built-in demo: a team that added its own in the admin (the demo
    stays on without UPSTREAM_BASE_URL) must not get canned answers by default.
    """
    opening = next((entry for entry in catalog if not entry.provider.is_demo), catalog[0])
    first = opening.provider
    site = CatalogEntry(first, first.default_model or opening.model)
    if access is None:
        return site
    chosen = find(catalog, access.default_model) if access.default_model else None
    for entry in (chosen, site, *catalog):
        if entry is not None and access.allows(entry.provider.pk, entry.model):
            return entry
    raise ChatError("model_not_allowed", _("No model is available to you; ask an administrator."))


async def access_for(user) -> Access:
    """The limits as they apply to `user`, read in one trip to a database thread (see access_of)."""
    return await db_threads.run(access_of)(user)
