"""Re-download the pinned front-end libraries from the npm registry into static/vendor/.

The chat page loads marked, DOMPurify and highlight.js as plain ES modules (KaTeX and, lazily,
Mermaid as UMD builds imported for their global), and the usage
dashboard Chart.js (its UMD build, which an ES module imports for its side effect of setting
globalThis.Chart: the ESM build imports a bare package name, which needs an import map, an
inline script the CSP forbids): no bundler and no CDN. This command is the only way those
files change: bump a version (and its integrity hash, from `npm view <name>@<version>
dist.integrity`) below and run it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

# Source maps are not vendored: the manifest storage would fail on a missing .map.
SOURCE_MAP_RE = re.compile(rb"^//# sourceMappingURL=.*$\n?", re.MULTILINE)


def npm_registry() -> str:
    """The registry npm itself is set up to use on this machine."""
    try:
        found = subprocess.run(["npm", "config", "get", "registry"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CommandError(f"cannot ask npm for its registry ({exc}); pass --registry") from None
    return found.stdout.strip()


@dataclass(frozen=True)
class Package:
    name: str  # npm name, maybe scoped
    version: str
    integrity: str  # npm's dist.integrity (sha512, base64)
    folder: str  # under static/vendor/
    files: dict[str, str]  # path in the tarball (under package/) -> file name in the folder
    # A path ending in "/" takes every file under it, into the subfolder named by its value (fonts).
    optional: tuple[str, ...] = ()  # files that may be missing from a release (licences)

    @property
    def tarball(self) -> str:
        return f"{self.name}/-/{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"


PACKAGES = [
    Package(
        "marked",
        "18.2.1",
        "sha512-ii4bxCTCqqwpT86XZWgJNs+ZnAIZksmLGYMViWA7PDIXYIeNo1x6cDdX3JOip9NM/cI6p8z57FxliACboTruMA==",
        "marked",
        {"lib/marked.esm.js": "marked.esm.js", "LICENSE": "LICENSE"},
    ),
    Package(
        "dompurify",
        "3.5.0",
        "sha512-LYC0ZkE8P1V42JsRYTwMdme/2ET8SpOc5AA2eOFjP/IadvRd2fwiT4TVz5vkfy0XUx12aS2UaRkTnfVPNOv9vw==",
        "dompurify",
        {
            "dist/purify.es.mjs": "purify.es.mjs",
            "dist/purify.min.js": "purify.min.js",  # for the diagram frame, which runs classic scripts
            "LICENSE": "LICENSE",
            "LICENSE-MPL": "LICENSE-MPL",
        },
        optional=("LICENSE-MPL",),
    ),
    Package(
        "@highlightjs/cdn-assets",
        "11.12.0",
        "sha512-KvOKXODaiFmId9xaq3xc5xCL66wVLUuOngDbO9B/kewbFTqdGbn2nJxNhN3H5R1cgDTVj6R8vH0zgiNDEGjpDw==",
        "highlight",
        {
            "es/highlight.min.js": "highlight.min.js",
            "styles/github.min.css": "github.min.css",
            "styles/github-dark.min.css": "github-dark.min.css",
            "LICENSE": "LICENSE",
        },
    ),
    Package(
        "chart.js",
        "4.6.1",
        "sha512-hJyniucsFmq//EvXYvJ6c6mahPoI3kaxdjVH8awTaJ/fDNWeSqqqArixMJWkWNN6fcYvPU3HneSANFNYtRi61g==",
        "chartjs",
        {"dist/chart.umd.min.js": "chart.umd.min.js", "LICENSE.md": "LICENSE.md"},
    ),
    # Math: the UMD build (sets globalThis.katex), its stylesheet and the fonts that names.
    Package(
        "katex",
        "0.19.1",
        "sha512-jG8uKntjSEcm2EpQOh0XturpPuuC9r3Sq5HLHdsFdWZT27E672SF19QEi+of0/YeOy15lDgRhKvr5614uRrEfA==",
        "katex",
        {
            "dist/katex.min.js": "katex.min.js",
            "dist/katex.min.css": "katex.min.css",
            "dist/fonts/": "fonts/",
            "LICENSE": "LICENSE",
        },
    ),
    # Diagrams: one UMD file (sets globalThis.mermaid), imported only when a mermaid block appears.
    Package(
        "mermaid",
        "12.3.0",
        "sha512-4113TdXeLAsMruJ79OpFL5O8+LTFXhQqZ260rF3tgUmiNAtRm4Uume04I+65PRN6yZ69J4f8rVYWW8zRk65UYw==",
        "mermaid",
        {"dist/mermaid.min.js": "mermaid.min.js", "LICENSE": "LICENSE"},
    ),
]


def check_integrity(data: bytes, integrity: str) -> None:
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512":
        raise CommandError(f"unsupported integrity algorithm {algorithm!r}")
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if actual != expected:
        raise CommandError(f"integrity mismatch: expected {integrity}, got sha512-{actual}")


def extract(package: Package, data: bytes) -> dict[str, bytes]:
    """The wanted files of a tarball, source-map comments removed from scripts."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            inner = member.name.split("/", 1)[-1]  # npm tarballs nest everything in package/
            if not member.isfile():
                continue
            if inner in package.files:
                name = package.files[inner]
            else:
                folder = next((path for path in package.files if path.endswith("/") and inner.startswith(path)), None)
                if folder is None:
                    continue
                name = package.files[folder] + inner[len(folder) :]
            content = archive.extractfile(member).read()
            if inner.endswith((".js", ".mjs")):
                content = SOURCE_MAP_RE.sub(b"", content)
            found[name] = content
    missing = [
        path
        for path, name in package.files.items()
        if path not in package.optional and not any(found_name.startswith(name) for found_name in found)
    ]
    if missing:
        raise CommandError(f"{package.name}@{package.version}: not in the tarball: {', '.join(missing)}")
    return found


class Command(BaseCommand):
    help = "Download the pinned front-end libraries (PACKAGES) into static/vendor/ and write VERSIONS."

    def add_arguments(self, parser):
        parser.add_argument("--registry", default=os.environ.get("NPM_CONFIG_REGISTRY") or npm_registry())
        parser.add_argument("--dest", default=str(Path(settings.BASE_DIR) / "static" / "vendor"))

    def handle(self, *args, registry: str, dest: str, **options):
        target = Path(dest)
        lines = ["# Written by `manage.py refreshvendor`; edit the pins in chat/management/commands/refreshvendor.py."]
        for package in PACKAGES:
            url = f"{registry.rstrip('/')}/{package.tarball}"
            self.stdout.write(f"{package.name}@{package.version}: {url}")
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
            check_integrity(data, package.integrity)
            files = extract(package, data)
            folder = target / package.folder
            folder.mkdir(parents=True, exist_ok=True)
            for name, content in sorted(files.items()):
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(content)
            lines.append(f"{package.name} {package.version} {package.folder}/ {package.integrity}")
        (target / "VERSIONS").write_text("\n".join(lines) + "\n")
        self.stdout.write(self.style.SUCCESS(f"Vendored {len(PACKAGES)} packages into {target}"))
