from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from chat.accounts import sign_in_view

urlpatterns = [
    # Before the admin's own URLs: its sign-in hashes passwords on the sign-in pool too (chat/accounts.py).
    path("admin/login/", sign_in_view(admin.site.login)),
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]
if settings.OIDC_ISSUER:  # /oidc/authenticate/ and /oidc/callback/ (chat/sso.py's views)
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
