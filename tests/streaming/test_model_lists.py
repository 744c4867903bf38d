"""A provider's model list (chat/streaming/providers.py): fetched from its GET /models, kept through an outage."""

from django.utils import timezone

from chat.streaming import providers as provider_lists
from tests.conftest import MODELS


async def test_a_provider_that_cannot_list_its_models_keeps_the_list_it_had(providers, settings):
    """An outage that outlasts the cache must not turn a request for its models into 404 "unknown model"."""
    settings.UPSTREAM_MODELS_CACHE_SECONDS = 0  # every call lists again
    provider = providers["api14"]
    listed = await provider_lists.model_ids(provider)
    assert MODELS["api14"] in listed
    provider.api_key = "no-longer-valid"  # the upstream now refuses to list (401), as in an outage
    assert await provider_lists.model_ids(provider) == listed
    provider.updated = timezone.now()  # reconfigured since: what it listed before says nothing of it now
    assert await provider_lists.model_ids(provider) == []
