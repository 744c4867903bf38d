"""What the provider says about a person: e-mail (verified unless the username says otherwise) and names."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class Claims(OAuth2Validator):
    def get_additional_claims(self, request):
        user = request.user
        return {
            "email": user.email,
            "email_verified": not user.username.startswith("unverified"),
            "preferred_username": user.username,
            "name": user.get_full_name() or user.username,
        }
