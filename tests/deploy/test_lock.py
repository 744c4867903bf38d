"""The lock files: every package pinned with hashes, in step with requirements*.txt, and what make installs."""

import re
import subprocess

from tests.live import ROOT

REQUIREMENTS = {"requirements.txt": "requirements.lock", "tests/requirements.txt": "tests/requirements.lock"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split("[", 1)[0]).lower()


def pins(path) -> dict[str, str]:
    """name -> version of every `name==version` line of a requirements file and the files it includes."""
    found = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found.update(pins((ROOT / path).parent.relative_to(ROOT) / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==", 1)
            found[canonical(name.strip())] = version.strip()
    return found


def locked(path) -> dict[tuple[str, str], list[str]]:
    """(name, version) -> hashes of every entry of a lock file (one package may be locked per platform)."""
    entries: dict[tuple[str, str], list[str]] = {}
    current = None
    for line in (ROOT / path).read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line):
            current = (canonical(match[1]), match[2])
            entries[current] = []
        elif current and (match := re.match(r"^\s+--hash=sha256:([0-9a-f]{64})", line)):
            entries[current].append(match[1])
        elif line.strip() and not line.lstrip().startswith("#"):
            current = None
    return entries


def test_every_requirement_is_locked_at_its_pinned_version_with_hashes():
    for requirements, lock in REQUIREMENTS.items():
        entries = locked(lock)
        missing = {name: version for name, version in pins(requirements).items() if (name, version) not in entries}
        assert not missing, f"{lock} is out of date with {requirements} (run `make lock`): {missing}"
        unhashed = [entry for entry, hashes in entries.items() if not hashes]
        assert not unhashed, f"{lock} has entries without hashes: {unhashed}"


def test_the_tests_run_on_the_versions_the_server_is_locked_to():
    server, tests = locked("requirements.lock"), locked("tests/requirements.lock")
    differ = {entry: hashes for entry, hashes in server.items() if tests.get(entry) != hashes}
    assert not differ, f"tests/requirements.lock differs from requirements.lock on {sorted(differ)}"


def test_make_installs_from_the_locks_with_hashes_required(tmp_path):
    venv = tmp_path / "venv"
    commands = {}
    for target in (".server-deps", ".test-deps"):
        dry_run = ["make", "--dry-run", "--always-make", f"VENV={venv}", f"{venv}/{target}"]
        result = subprocess.run(dry_run, cwd=ROOT, capture_output=True, text=True, check=True)
        commands[target] = [line for line in result.stdout.splitlines() if "pip install" in line and " -r " in line]
    assert commands[".server-deps"] == [f"{venv}/bin/pip install --quiet --require-hashes -r requirements.lock"]
    assert commands[".test-deps"] == [f"{venv}/bin/pip install --quiet --require-hashes -r tests/requirements.lock"]


def test_node_clients_are_pinned_with_integrity_hashes():
    """tests/node: each client pinned to one version, and every package of the tree locked with a hash."""
    import json

    manifest = json.loads((ROOT / "tests/node/package.json").read_text())
    lock = json.loads((ROOT / "tests/node/package-lock.json").read_text())
    packages = lock["packages"]
    for name, version in manifest["dependencies"].items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{name} is not pinned: {version}"
        assert packages[f"node_modules/{name}"]["version"] == version, name
    assert packages[""]["dependencies"] == manifest["dependencies"]  # the lock is the manifest's
    for path, entry in packages.items():
        if path:
            assert entry.get("integrity", "").startswith("sha512-"), path
