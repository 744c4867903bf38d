"""Headers on every response: a Content-Security-Policy (no inline script), no-store on JSON and streams."""

from django.utils.cache import patch_cache_control
from django.utils.deprecation import MiddlewareMixin

POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # data: for small inline icons; images from other origins are never loaded
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# Django's admin templates carry a few style attributes; scripts stay 'self' there too.
ADMIN_POLICY = POLICY.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Sync and async alike (MiddlewareMixin), so async views and streams stay on the event loop."""

    def process_response(self, request, response):
        policy = ADMIN_POLICY if request.path.startswith("/admin/") else POLICY
        response.headers.setdefault("Content-Security-Policy", policy)
        return response


# Answers, conversations and usage are private: no browser, proxy or CDN may keep a copy.
PRIVATE_TYPES = ("application/json", "text/event-stream")
PRIVATE_PATHS = ("/api/", "/v1/")


class NoStoreMiddleware(MiddlewareMixin):
    """`Cache-Control: no-store` on every JSON response, every /v1 stream and everything under /api/ and /v1/."""

    def process_response(self, request, response):
        if response.get("Content-Type", "").startswith(PRIVATE_TYPES) or request.path.startswith(PRIVATE_PATHS):
            patch_cache_control(response, no_store=True)
        return response
