from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from chat.auth import invites
from chat.auth.password_reset import PasswordResetForm
from chat.auth.signin import sign_in_view
from chat.views import (
    api_not_found,
    attachments,
    conversations,
    diagrams,
    embeddings_api,
    json_api,
    manifest,
    models_api,
    openai_api,
    presets,
    responses_api,
    shares,
    sidebar,
    stored_responses,
    tools,
    usage,
)

urlpatterns = [
    # First: the relay is the busiest path, and Django tries the patterns in order.
    path("v1/chat/completions", openai_api.chat_completions, name="v1-chat-completions"),
    path("v1/models", models_api.models, name="v1-models"),
    path("v1/models/<path:model_id>", models_api.model, name="v1-model"),
    path("v1/embeddings", embeddings_api.embeddings, name="v1-embeddings"),
    path("v1/responses", responses_api.responses, name="v1-responses"),
    path("v1/responses/<str:response_id>", stored_responses.stored_response, name="v1-response"),
    path("", conversations.index, name="index"),
    path("c/<int:conversation_id>/", conversations.index, name="conversation"),
    path(
        "accounts/login/",
        sign_in_view(auth_views.LoginView.as_view(redirect_authenticated_user=True)),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/password/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("accounts/password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path(
        "accounts/password/reset/",
        auth_views.PasswordResetView.as_view(form_class=PasswordResetForm),
        name="password_reset",
    ),
    path("accounts/password/reset/sent/", auth_views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path(
        "accounts/password/reset/<uidb64>/<token>/",
        sign_in_view(auth_views.PasswordResetConfirmView.as_view()),
        name="password_reset_confirm",
    ),
    path(
        "accounts/password/reset/complete/",
        auth_views.PasswordResetCompleteView.as_view(),
        name="password_reset_complete",
    ),
    path("accounts/invite/<str:secret>/", sign_in_view(invites.accept), name="invite"),
    path("accounts/signup/", invites.signup, name="signup"),
    path("api/models", conversations.models_list, name="models"),
    path("api/conversations", conversations.conversations, name="conversations"),
    path("api/budget", conversations.budget, name="budget"),
    path("api/tools", tools.tools, name="tools"),
    path("api/attachments", attachments.upload, name="attachments"),
    path("api/attachments/<int:attachment_id>", attachments.attachment, name="attachment"),
    path("api/conversations/<int:conversation_id>", conversations.conversation, name="conversation-detail"),
    path("api/presets", presets.presets, name="presets"),
    path("api/presets/<int:preset_id>", presets.preset, name="preset"),
    path("api/defaults", presets.defaults, name="defaults"),
    path("settings/", conversations.settings_page, name="settings"),
    path("settings/tokens/", conversations.tokens, name="tokens"),
    path("settings/delete-conversations/", sidebar.delete_all, name="delete-conversations"),
    path("api/folders", sidebar.folders, name="folders"),
    path("api/folders/<int:folder_id>", sidebar.folder, name="folder"),
    path("docs/api/", conversations.api_guide, name="api-guide"),
    path("diagram-frame/", diagrams.diagram_frame, name="diagram-frame"),
    path("manifest.webmanifest", manifest.web_manifest, name="web-manifest"),
    path("favicon.ico", manifest.favicon, name="favicon"),
    path("usage/", usage.usage, name="usage"),
    path("usage/csv", usage.usage_csv, name="usage-csv"),
    path("settings/tokens/<int:token_id>/revoke/", conversations.revoke_token, name="revoke-token"),
    # Share links, export and import (chat/views/shares.py).
    path("s/<str:token>/", shares.shared, name="shared"),
    path("s/<str:token>/continue", shares.continue_shared, name="shared-continue"),
    path("api/shares", shares.shares, name="shares"),
    path("api/shares/<int:share_id>", shares.share, name="share"),
    path("api/conversations/<int:conversation_id>/shares", shares.conversation_shares, name="conversation-shares"),
    path("api/conversations/<int:conversation_id>/export", shares.export_conversation, name="export"),
    path("api/export", shares.export_all, name="export-all"),
    path("api/import", shares.import_conversations, name="import"),
    # Last: any other path under /v1/ answers in OpenAI's error JSON, after every route of its own; under /api/, in
    # the page's.
    re_path(r"^v1(?:/(?P<rest>.*))?$", api_not_found.unknown_path, name="v1-unknown"),
    re_path(r"^api/(?P<rest>.*)$", json_api.unknown_path, name="api-unknown"),
]
