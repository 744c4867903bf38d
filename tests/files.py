"""Small real files for the attachment tests, made here: a PDF with text, a Word document, images."""

from __future__ import annotations

import io


def pdf(*pages: str) -> bytes:
    """A valid PDF (correct xref offsets) with one line of Helvetica text per page."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", ""]
    kids = []
    font = 3
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for text in pages:
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 14 Tf 40 780 Td ({escaped}) Tj ET"
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
        content = len(objects)
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents {content} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>"
        )
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def docx(*paragraphs: str) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def image(width: int = 64, height: int = 48, format: str = "PNG", color=(200, 40, 40), exif: bool = False) -> bytes:
    """A solid image; with exif, a JPEG carrying a camera model, a GPS position and orientation 6 (rotated)."""
    from PIL import Image

    picture = Image.new("RGB", (width, height), color)
    picture.paste((20, 20, 220), (0, 0, width // 4, height // 4))  # a corner to tell the orientation by
    buffer = io.BytesIO()
    options = {}
    if exif:
        data = Image.Exif()
        data[0x0110] = "Secret Camera 9000"  # Model
        data[0x0112] = 6  # Orientation: rotate 90° clockwise to display
        data[0x8825] = {1: "N", 2: (51.0, 30.0, 0.0)}  # GPSInfo
        options["exif"] = data.tobytes()
    picture.save(buffer, format=format, **options)
    return buffer.getvalue()


def noise(width: int, height: int) -> bytes:
    """A PNG of random pixels: it does not compress, so its size is about 3 bytes a pixel."""
    import os

    from PIL import Image

    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def gif(frames: int = 3) -> bytes:
    from PIL import Image

    pictures = [Image.new("RGB", (40, 30), (10 * i, 100, 200)) for i in range(frames)]
    buffer = io.BytesIO()
    pictures[0].save(buffer, format="GIF", save_all=True, append_images=pictures[1:])
    return buffer.getvalue()
