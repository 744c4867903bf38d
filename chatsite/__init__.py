"""The chat server's Django project."""

# The release, said by the start-up line and the docs; a deploy from git may say its commit instead.
VERSION = "2026.12"
