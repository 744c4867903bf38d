"""Set up and serve the test provider: `python -m tests.oidc_provider --fd N --issuer URL --db FILE
--client ID:SECRET:REDIRECT --person USERNAME:PASSWORD:EMAIL …` (uvicorn on the listening socket N, which
the caller bound)."""

import argparse
import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--db", required=True, help="its SQLite file (the caller removes it)")
    parser.add_argument("--client", required=True, help="CLIENT_ID:SECRET:REDIRECT_URI")
    parser.add_argument("--person", action="append", default=[], help="USERNAME:PASSWORD:EMAIL")
    options = parser.parse_args()

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    os.environ["OIDC_PROVIDER_KEY"] = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    os.environ["OIDC_PROVIDER_ISSUER"] = options.issuer
    os.environ["OIDC_PROVIDER_DB"] = options.db
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)

    from django.contrib.auth.models import User
    from oauth2_provider.models import Application

    client_id, secret, redirect = options.client.split(":", 2)
    Application.objects.create(
        name="team chat",
        client_id=client_id,
        client_secret=secret,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=redirect,
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )
    for person in options.person:
        username, password, email = person.split(":", 2)
        User.objects.create_user(username, email=email, password=password)

    import uvicorn
    from django.core.asgi import get_asgi_application

    uvicorn.run(get_asgi_application(), fd=options.fd, log_level="warning")


if __name__ == "__main__":
    main()
