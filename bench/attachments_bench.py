"""How long reading an attachment takes (chat/lib/attachment_content.py), in the time- and memory-limited child process.

For each kind of file it prints the median of --runs readings through `inspect_limited`
(fork from the forkserver, send the bytes, read, send the result back) and, beside it,
`inspect` in this process, so the difference is the child's cost. The files are made here:
a 12-megapixel camera JPEG with EXIF, a 4000×3000 PNG screenshot-like image, a 100-page
PDF, a 200-paragraph Word document and 1 MB of text.

    .venv/bin/python bench/attachments_bench.py
    .venv/bin/python bench/attachments_bench.py --runs 10
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chat.lib import attachment_content
from tests import files


def screenshot_png() -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (4000, 3000), (245, 246, 248))
    draw = ImageDraw.Draw(image)
    for y in range(0, 3000, 40):
        draw.text((40, y), "A line of text in a window, as a screenshot has. " * 8, fill=(30, 30, 30))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def samples() -> dict[str, bytes]:
    return {
        "camera JPEG 4000×3000, EXIF": files.image(4000, 3000, "JPEG", exif=True),
        "screenshot PNG 4000×3000": screenshot_png(),
        "PDF, 100 pages": files.pdf(*(f"Page {n}: the quarterly figures, line after line." * 20 for n in range(100))),
        "Word, 200 paragraphs": files.docx(*(f"Paragraph {n} of the report. " * 10 for n in range(200))),
        "text, 1 MB": b"log line: request served in 12 ms\n" * 30_000,
    }


def median_ms(read, data: bytes, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        read(data)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    attachment_content.inspect_limited(files.pdf("warm up"), timeout=60)  # the forkserver starts once per process
    print(f"{'file':32} {'bytes':>11} {'child ms':>9} {'in-process ms':>14}  result")
    for name, data in samples().items():
        child = median_ms(lambda d: attachment_content.inspect_limited(d, timeout=60), data, args.runs)
        local = median_ms(attachment_content.inspect, data, args.runs)
        read = attachment_content.inspect(data)
        result = f"{read.width}×{read.height} {read.content_type}" if read.kind == "image" else f"{read.tokens} tokens"
        print(f"{name:32} {len(data):>11,} {child:>9.0f} {local:>14.0f}  {result}")


if __name__ == "__main__":
    main()
