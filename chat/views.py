"""HTTP views of the chat app."""

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse

from .models import Provider


@login_required
async def models_list(request):
    """The models a user can pick, as `provider/model` ids with the provider's default first."""
    catalog = await Provider.objects.acatalog()
    return JsonResponse(
        {
            "models": [
                {"id": entry.model, "qualified": entry.qualified, "provider": entry.provider.name} for entry in catalog
            ],
            "demo_only": bool(catalog) and all(entry.provider.is_demo for entry in catalog),
        }
    )
