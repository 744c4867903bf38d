"""People in the admin: API tokens, budgets on the user page, chat defaults on the group page, invites."""

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.db import transaction

from chat.auth.invites import send_invite
from chat.models import ApiToken, Budget, GroupDefaults, Invite
from chat.models.invites import account_exists


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Every user's tokens; only a prefix is known here, the secret was shown once to its owner."""

    list_display = ["name", "user", "prefix", "created", "last_used", "revoked"]
    list_filter = [("revoked", admin.EmptyFieldListFilter), ("user", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    list_select_related = ["user"]
    readonly_fields = ["user", "name", "prefix", "created", "last_used", "revoked"]
    fields = readonly_fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    # Revoking changes a token: staff who may only view tokens do not get the action.
    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        for token in queryset:
            token.revoke()
        self.message_user(request, f"Revoked {queryset.count()} token(s).")


# --- prices and budgets -------------------------------------------------------


class BudgetInline(admin.StackedInline):
    model = Budget
    fk_name = "user"
    fields = ["usd", "tokens"]
    can_delete = True
    verbose_name = "monthly budget"
    verbose_name_plural = "monthly budget (empty: the group's or the default)"


User = get_user_model()
if admin.site.is_registered(User) and isinstance(admin.site._registry[User], UserAdmin):
    # The user admin gains the budget inline; the rest of it stays Django's.
    user_admin = type(admin.site._registry[User])
    admin.site.unregister(User)

    @admin.register(User)
    class UserWithBudgetAdmin(user_admin):
        inlines = [*user_admin.inlines, BudgetInline]


class GroupDefaultsInline(admin.StackedInline):
    model = GroupDefaults
    fields = ["default_model", "system_prompt", "tools"]
    can_delete = True


if admin.site.is_registered(Group) and isinstance(admin.site._registry[Group], GroupAdmin):
    # The group admin gains the chat defaults; the rest of it stays Django's.
    group_admin = type(admin.site._registry[Group])
    admin.site.unregister(Group)

    @admin.register(Group)
    class GroupWithDefaultsAdmin(group_admin):
        inlines = [*group_admin.inlines, GroupDefaultsInline]


# --- invites -------------------------------------------------------------------------


class InviteForm(forms.ModelForm):
    class Meta:
        model = Invite
        fields = ["email", "staff", "groups"]

    def clean_email(self) -> str:
        email = User.objects.normalize_email(self.cleaned_data["email"].strip())
        if account_exists(email):
            raise forms.ValidationError(f"{email} already has an account.")
        return email


@admin.register(Invite)
class InviteAdmin(admin.ModelAdmin):
    """Invite by e-mail: saving a new one e-mails its link (also shown once here); links cannot be seen again."""

    form = InviteForm
    list_display = ["email", "staff", "created", "created_by", "expires", "used", "user"]
    list_filter = [("used", admin.EmptyFieldListFilter), "staff"]
    search_fields = ["email"]
    filter_horizontal = ["groups"]
    actions = ["send_again"]

    def get_readonly_fields(self, request, obj=None):
        return ["email", "staff", "created", "created_by", "expires", "used", "user"] if obj else []

    def save_model(self, request, obj, form, change):
        secret = None
        if not change:
            secret = obj.new_secret()
            obj.created_by = request.user
            obj.replaced = Invite.withdraw_waiting(obj.email)
        super().save_model(request, obj, form, change)
        if secret is not None:
            # Once the admin's transaction has committed: an SMTP server taking its EMAIL_TIMEOUT must not hold
            # the database (SQLite's write lock) meanwhile.
            transaction.on_commit(lambda: self.send(request, obj, secret))

    def send(self, request, invite: Invite, secret: str) -> None:
        """E-mail the link; staff see it once too, to pass on if the e-mail does not arrive."""
        if invite.replaced:
            self.message_user(request, f"The earlier invite for {invite.email} is withdrawn: its link no longer works.")
        try:
            send_invite(invite, secret)
            self.message_user(request, f"Invite e-mailed to {invite.email}. Its link: {Invite.link(secret)}")
        except OSError as exc:
            self.message_user(
                request, f"Could not e-mail {invite.email} ({exc}); send them this link: {Invite.link(secret)}",
                level="warning",
            )  # fmt: skip

    @admin.action(description="Send a new link (the old one stops working)", permissions=["add"])
    def send_again(self, request, queryset):
        for invite in queryset.filter(used__isnull=True):
            secret = invite.new_secret()
            invite.replaced = Invite.withdraw_waiting(invite.email, keep=invite.pk)
            invite.save(update_fields=["digest", "expires"])
            self.send(request, invite, secret)
