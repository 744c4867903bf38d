"""A real OpenID Connect provider for the single sign-on tests: a tiny Django project on django-oauth-toolkit.

`python -m tests.oidc_provider --fd N` (see __main__.py) migrates its own SQLite file,
makes the chat's client and the people given, and serves on the socket it is handed.
"""
