from django.contrib import admin
from django.urls import include, path

from chat.accounts import sign_in_view

urlpatterns = [
    # Before the admin's own URLs: its sign-in hashes passwords on the sign-in pool too (chat/accounts.py).
    path("admin/login/", sign_in_view(admin.site.login)),
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]
