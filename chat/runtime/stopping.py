"""Whether this process has begun its graceful stop (chatsite.server), for what must not start any more."""

# The websocket close code of a stop, the registered "service restart": clients reconnect.
RESTART_CLOSE_CODE = 1012

_draining = False


def drain() -> None:
    """The process is stopping: its running streams may finish, new turns go to another process."""
    global _draining
    _draining = True


def draining() -> bool:
    return _draining
