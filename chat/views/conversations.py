"""The chat page and the small JSON API it reads conversations through (session auth)."""

from __future__ import annotations

import functools

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from chat.actions import sidebar_events
from chat.actions.deletes import delete_conversations
from chat.lib import model_params
from chat.lib.conversation_json import branch_json, message_json
from chat.lib.request_fields import parse_params, parse_system_prompt
from chat.metering import budgets
from chat.models import ApiToken, ChatError, Conversation, ConversationRead, Provider
from chat.models.attachments import MAX_PER_MESSAGE as MAX_ATTACHMENTS
from chat.streaming.catalog import access_for, load_catalog, resolve_model
from chat.streaming.providers import makes_embeddings
from chat.views.json_api import api, error, json_body
from chat.views.sidebar import page
from chat.views.sidebar import update as organising_fields

MAX_TITLE = 200


@login_required
def index(request, conversation_id: int | None = None):
    """The chat page; /c/<id>/ opens a conversation (404 for anyone but its owner)."""
    if conversation_id is not None:
        get_object_or_404(Conversation.objects.owned_by(request.user), pk=conversation_id)
    providers = list(Provider.objects.enabled())
    config = {
        "conversation": conversation_id,
        "username": request.user.get_username(),
        "wsPath": "/ws/chat/",
        "maxContentBytes": settings.CHAT_MAX_CONTENT_BYTES,
        "demoOnly": bool(providers) and all(p.is_demo for p in providers),
        "noProvider": not providers,
        "csrfToken": get_token(request),
        "attachments": {
            "maxFileBytes": settings.ATTACHMENT_MAX_FILE_BYTES,
            "maxMessageBytes": settings.ATTACHMENT_MAX_MESSAGE_BYTES,
            "maxMessageTokens": settings.ATTACHMENT_MAX_MESSAGE_TOKENS,
            "maxPerMessage": MAX_ATTACHMENTS,
            "uploadsAtOnce": settings.ATTACHMENT_MAX_UPLOADS_IN_FLIGHT,
        },
    }
    # The settings form's bounds are the server's (chat/lib/model_params.py): the browser flags a value before sending.
    limits = {"max_tokens": settings.MAX_TOKENS_LIMIT, "system_prompt": model_params.MAX_SYSTEM_PROMPT}
    return render(request, "chat/index.html", {"config": config, "limits": limits})


async def models_list(request):
    """The models this user may pick: plain ids, `provider/model` ids, and their default (their group's)."""
    user = await request.auser()
    if not user.is_authenticated:
        return error(401, "unauthenticated", _("Sign in first."))
    access = await access_for(user)
    catalog = await load_catalog(access)
    default = None
    try:
        default = (await resolve_model(None, access)).qualified if catalog else None
    except ChatError:
        pass  # nothing this person may use
    return JsonResponse(
        {
            "models": [
                {
                    "id": entry.model,
                    "qualified": entry.qualified,
                    "provider": entry.provider.name,
                    "images": entry.provider.accepts_images(entry.model),
                }
                for entry in catalog
                if not makes_embeddings(entry.provider, entry.model)  # no chat with an embedding model
            ],
            "default": default,
            "demo_only": bool(catalog) and all(entry.provider.is_demo for entry in catalog),
        }
    )


@require_GET
@api
def conversations(request):
    """The user's conversations a page at a time, newest first; `q` searches titles and message text."""
    return JsonResponse(page(request.user, request.GET))


@never_cache
@require_GET
@api
def budget(request):
    """The signed-in person's month so far: budget, spent (with running reservations) and remaining."""
    return JsonResponse(budgets.summary(request.user))


@require_http_methods(["GET", "PATCH", "DELETE"])
@api
def conversation(request, conversation_id: int):
    """One conversation with its messages; PATCH title/system_prompt/params; DELETE."""
    found = Conversation.objects.owned_by(request.user).filter(pk=conversation_id).first()
    if found is None:
        raise ChatError("not_found", _("No such conversation."))
    if request.method == "DELETE":
        delete_conversations(Conversation.objects.filter(pk=found.pk), sidebar_events.tab_of(request))
        return HttpResponse(status=204)
    if request.method == "PATCH":
        update(found, json_body(request))
        sidebar_events.changed(found, sidebar_events.tab_of(request))
    return JsonResponse(detail(found, before=message_id(request.GET.get("before"))))


def message_id(value: str | None) -> int | None:
    """`before`: the id of the first message the page shows (it asks for the ones before it)."""
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise ChatError("bad_field", _("`before` must be the id of a message."))
    return int(value)


def update(conversation: Conversation, body: dict) -> None:
    fields = []
    if "title" in body:
        title = body["title"]
        if not isinstance(title, str) or not title.strip():
            raise ChatError("bad_field", _("`title` must be a non-empty string."))
        conversation.title = title.strip()[:MAX_TITLE]
        conversation.title_locked = True  # renamed by its owner: never retitled by a model (chat/actions/titles.py)
        fields += ["title", "title_locked"]
    if "system_prompt" in body:
        if body["system_prompt"] is None:
            raise ChatError("bad_field", _("`system_prompt` must be a string."))
        conversation.system_prompt = parse_system_prompt(body["system_prompt"])
        fields.append("system_prompt")
    if "params" in body:
        conversation.merge_params(parse_params(body["params"]))
        fields.append("params")
    fields += organising_fields(conversation, body)
    if not fields:
        raise ChatError(
            "bad_field", _("Nothing to change: send title, system_prompt, params, pinned, archived, folder.")
        )
    conversation.save(update_fields=fields)


def detail(conversation: Conversation, before: int | None = None) -> dict:
    """The conversation with the messages of the branch shown (`current`'s path), each with its siblings.

    At most CHAT_PAGE_MESSAGES of them, the last ones (or the last before the message `before`);
    `earlier` says whether the branch has more before them, which the page loads as it is scrolled up.
    """
    path = conversation.path_ids()
    end = path.index(before) if before is not None and before in path else len(path)
    shown = path[max(0, end - settings.CHAT_PAGE_MESSAGES) : end]
    messages = conversation.messages.filter(pk__in=shown).prefetch_related("usages", "attachments")
    streaming = conversation.messages.streaming().values_list("pk", flat=True).first()
    siblings = conversation.siblings(shown)
    return {
        "id": conversation.pk,
        "title": conversation.title,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "params": conversation.params,
        "updated": conversation.updated.isoformat(),
        "pinned": conversation.pinned,
        "archived": conversation.archived,
        "folder": conversation.folder_id,
        "streaming": streaming,
        "messages": [{**message_json(m), **branch_json(m, siblings)} for m in messages],
        "earlier": end > len(shown),
        "current": conversation.current_id,
        "reviewed_by": reviewed_by(conversation),
    }


def reviewed_by(conversation: Conversation) -> list[dict] | None:
    """Who else read it, newest first, when CHAT_SHOW_REVIEWS lets owners see that (else None)."""
    if not settings.CHAT_SHOW_REVIEWS:
        return None
    reads = ConversationRead.objects.of(conversation)[:20]
    return [{"reader": read.reader.get_username() if read.reader else None, "read": read.read.isoformat()}
            for read in reads]  # fmt: skip


# --- the settings page ------------------------------------------------------------

# Each section of /settings/ may add a module script here (a path under static/).
SETTINGS_SCRIPTS: list[str] = []
SETTINGS_SCRIPTS.append("chat/data.js")  # settings/data.html: export, import, share links
SETTINGS_SCRIPTS.append("settings/presets.js")  # defaults for new chats, prompt presets


@login_required
@never_cache
def settings_page(request):
    """The person's settings: defaults for new chats, language, their data (one template per section)."""
    return render(request, "settings/index.html", {"scripts": SETTINGS_SCRIPTS})


# --- personal API tokens -------------------------------------------------------


NEW_TOKEN_SESSION_KEY = "chat.new_token"


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def tokens(request):
    """List the user's API tokens and create one; a new token's secret is shown once, after a redirect."""
    problem = None
    if request.method == "POST":
        name = request.POST.get("name", "").strip()
        if not name or len(name) > 100:
            problem = _("Give the token a name of at most 100 characters.")
        else:
            # POST/redirect/GET: reloading the page shows the list, and creates no second token.
            request.session[NEW_TOKEN_SESSION_KEY] = ApiToken.issue(request.user, name)[1]
            return redirect("tokens")
    context = {
        "tokens": request.user.api_tokens.all(),
        "secret": request.session.pop(NEW_TOKEN_SESSION_KEY, None),
        "problem": problem,
        "base_url": request.build_absolute_uri("/v1"),
    }
    return render(request, "tokens/list.html", context, status=400 if problem else 200)


@login_required
@require_GET
def api_guide(request):
    """docs/api.md as a page of the site, drawn by the page's own markdown code."""
    context = {"guide": _api_guide_text(), "base_url": request.build_absolute_uri("/v1")}
    return render(request, "tokens/guide.html", context)


@functools.cache
def _api_guide_text() -> str:
    return (settings.BASE_DIR / "docs" / "api.md").read_text(encoding="utf-8")


@login_required
@require_POST
def revoke_token(request, token_id: int):
    get_object_or_404(ApiToken.objects.filter(user=request.user), pk=token_id).revoke()
    return redirect("tokens")
