"""Prompt presets and personal defaults in the admin: staff publish their own preset to everyone (or withdraw any),
and every look at someone's private text is recorded, as a conversation's is (chat/admin/conversations.py)."""

from django import forms
from django.contrib import admin

from chat.admin.review import shown
from chat.models import ChatDefaults, ConversationRead, PromptPreset

PUBLISH_OWN = "Only its owner can publish a private preset: it would show their text to everyone."


def publishing_checked(form_class: type[forms.ModelForm], user) -> type[forms.ModelForm]:
    """`form_class` refusing to publish a preset `user` does not own (withdrawing one stays open to staff)."""

    class Checked(form_class):
        def clean(self):
            cleaned = super().clean()
            owner = cleaned.get("owner", self.instance.owner if self.instance.owner_id else None)
            publishing = cleaned.get("published") and not (self.instance.pk and self.instance.published)
            if publishing and owner is not None and owner.pk != user.pk:
                raise forms.ValidationError(PUBLISH_OWN)
            return cleaned

    return Checked


@admin.register(PromptPreset)
class PromptPresetAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "model", "published", "updated"]
    list_filter = ["published", ("owner", admin.RelatedOnlyFieldListFilter)]
    list_editable = ["published"]
    # Not the text: searching it would read everyone's private presets with nothing recorded.
    search_fields = ["name", "owner__username"]
    list_select_related = ["owner"]
    raw_id_fields = ["owner"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        return publishing_checked(super().get_form(request, obj, change, **kwargs), request.user)

    def get_changelist_form(self, request, **kwargs):
        return publishing_checked(super().get_changelist_form(request, **kwargs), request.user)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Staff reading someone's private preset is recorded (listed under Conversation reads)."""
        preset = self.get_object(request, object_id)
        response = super().change_view(request, object_id, form_url, extra_context)
        if preset is not None and not preset.published and shown(request, response):
            ConversationRead.record_owned(preset.owner_id, request.user, f"preset “{preset.name}”", "admin preset")
        return response


@admin.register(ChatDefaults)
class ChatDefaultsAdmin(admin.ModelAdmin):
    list_display = ["user", "model", "temperature"]
    search_fields = ["user__username", "model"]
    list_select_related = ["user"]
    raw_id_fields = ["user"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Staff reading someone's defaults (their own system prompt) is recorded."""
        defaults = self.get_object(request, object_id)
        response = super().change_view(request, object_id, form_url, extra_context)
        if defaults is not None and shown(request, response):
            ConversationRead.record_owned(defaults.user_id, request.user, "defaults (system prompt)", "admin defaults")
        return response
