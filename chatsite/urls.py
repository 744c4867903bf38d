from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.i18n import JavaScriptCatalog, set_language

from chat.auth.signin import sign_in_view

urlpatterns = [
    # Before the admin's own URLs: its sign-in hashes passwords on the sign-in pool too (chat/auth/signin.py).
    path("admin/login/", sign_in_view(admin.site.login)),
    path("admin/", admin.site.urls),
    # The page's modules translate through this catalogue (static/chat/i18n.js); the switch posts to setlang.
    path("jsi18n/", JavaScriptCatalog.as_view(packages=["chat"]), name="javascript-catalog"),
    path("i18n/setlang/", set_language, name="set_language"),
    path("", include("chat.urls")),
]
if settings.OIDC_ISSUER:  # /oidc/authenticate/ and /oidc/callback/ (chat/auth/oidc.py's views)
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
# A refused request (a Host not in ALLOWED_HOSTS) under /v1/ or /api/ gets JSON its client can read.
handler400 = "chat.views.json_api.bad_request"
