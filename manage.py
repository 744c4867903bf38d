#!/usr/bin/env python
"""Django's command-line utility for administrative tasks; reads .env beside it as `make run` does."""

import os
import sys
from pathlib import Path

from chatsite import dotenv


def main() -> None:
    # So `changepassword`, `rollup` or `invite` act on the database and site that `make run` serves.
    dotenv.load(Path(__file__).resolve().parent / ".env")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
