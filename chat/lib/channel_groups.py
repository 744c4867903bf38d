"""Channel-layer group names: which sockets a message reaches."""


def user_group(user_id: int) -> str:
    """The channel-layer group of every socket of one user."""
    return f"chat.user.{user_id}"
