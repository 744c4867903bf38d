"""Prompt presets in the admin: staff publish one to everyone (or withdraw it) with its flag."""

from django.contrib import admin

from chat.models import ChatDefaults, PromptPreset


@admin.register(PromptPreset)
class PromptPresetAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "model", "published", "updated"]
    list_filter = ["published", ("owner", admin.RelatedOnlyFieldListFilter)]
    list_editable = ["published"]
    search_fields = ["name", "text", "owner__username"]
    list_select_related = ["owner"]
    raw_id_fields = ["owner"]


@admin.register(ChatDefaults)
class ChatDefaultsAdmin(admin.ModelAdmin):
    list_display = ["user", "model", "temperature"]
    search_fields = ["user__username", "model"]
    list_select_related = ["user"]
    raw_id_fields = ["user"]
