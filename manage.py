#!/usr/bin/env python
"""Django's command-line utility for administrative tasks; reads .env beside it as `make run` does."""

import os
import sys
from pathlib import Path


def read_env_file(path: Path) -> None:
    """KEY=value lines of a .env file into the environment, where the environment does not set them already.

    So `manage.py changepassword`, `rollup` or `invite` act on the database and site that `make run` serves.
    The shell's simple forms: `export ` before a name, '…' or "…" around a value, # comments.
    """
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        line = line.strip().removeprefix("export ").strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].strip()
        os.environ.setdefault(name, value)


def main() -> None:
    read_env_file(Path(__file__).resolve().parent / ".env")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
