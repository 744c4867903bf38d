"""The .env file beside the code: read one way by `manage.py` and by `make run` (no Django).

Its values fill the variables the environment does not set: `DATABASE_URL=… make run` and
`DATABASE_URL=… manage.py …` both win over the file. Lines are KEY=value with the shell's simple
forms (`export ` before a name, '…' or "…" around a value, # comments), but nothing in a value is
run: `OIDC_NAME=single sign-on` and `LDAP_USER_FILTER=(uid=%(user)s)` are text, as .env.example
writes them.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

PATH = Path(__file__).resolve().parent.parent / ".env"


def parse(text: str) -> dict[str, str]:
    """The KEY=value pairs of a .env file's text."""
    values = {}
    for line in text.splitlines():
        line = line.strip().removeprefix("export ").strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].strip()
        values[name] = value
    return values


def unset(path: Path = PATH) -> dict[str, str]:
    """The file's values for the variables the environment does not set."""
    if not path.is_file():
        return {}
    return {name: value for name, value in parse(path.read_text()).items() if name not in os.environ}


def load(path: Path = PATH) -> None:
    """Into this process's environment (manage.py)."""
    os.environ.update(unset(path))


if __name__ == "__main__":  # `eval "$(python -m chatsite.dotenv)"` in `make run`: the same values, quoted for the shell
    chosen = unset(Path(sys.argv[1]) if len(sys.argv) > 1 else PATH)
    sys.stdout.write("".join(f"export {name}={shlex.quote(value)}\n" for name, value in chosen.items()))
