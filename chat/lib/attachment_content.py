"""What an attached file is, by its content, and what goes to the model: text or a re-encoded image (no Django).

`inspect(data, name)` is the whole job: it sniffs the type from the bytes (never the name),
extracts a document's text (pypdf for PDF, python-docx for Word) or decodes an image, applies
EXIF orientation, drops EXIF and every other metadata, scales it to at most MAX_SIDE px on
the long side and encodes it again (GIF: its first frame, as PNG). A file it cannot read raises
`Unreadable` with a sentence for the user.

`inspect_limited(...)` runs it in a child process of a forkserver with a time limit and
a memory limit: a crafted PDF that loops, or an image that inflates to gigabytes, costs
one killed process, never the server's event loop or memory.
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import resource
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

from chat.lib.token_estimate import estimate_tokens

MAX_SIDE = 2048
# A decoded image of more pixels is refused before it is decoded (a "decompression bomb").
MAX_PIXELS = 50_000_000
# The child process's address space: room for a 50-megapixel RGBA image and its resized copy.
MEMORY_LIMIT = 1536 * 1024 * 1024

IMAGE_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
# What each image is stored and sent as: GIF's first frame becomes a PNG.
OUTPUT_FORMAT = {"PNG": "PNG", "JPEG": "JPEG", "WEBP": "WEBP", "GIF": "PNG"}
DOCUMENT_TYPES = {
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "text": "text/plain",
}


def gettext_noop(message: str) -> str:
    """Marks a message for the French catalogue (makemessages looks for this name); the caller translates it."""
    return message


class Unreadable(Exception):
    """A file that is not a supported type, or is broken: `message % params` is for the user, in English;
    translated() in their language (the message is looked up in the catalogue before the params go in)."""

    def __init__(self, message: str, **params: object) -> None:
        super().__init__(message % params if params else message)
        self.message, self.params = message, params

    def translated(self, gettext: Callable[[str], str]) -> str:
        return gettext(self.message) % self.params if self.params else gettext(self.message)


@dataclass(frozen=True)
class Inspected:
    kind: str  # "document" or "image"
    type: str  # pdf, docx, text; PNG, JPEG, WEBP, GIF (what it was)
    content_type: str  # of `data`
    data: bytes  # what is stored: the original document, or the re-encoded image
    text: str = ""  # a document's text
    width: int | None = None
    height: int | None = None

    @property
    def tokens(self) -> int:
        return estimate_tokens(len(self.text)) if self.kind == "document" else image_tokens(self.width, self.height)


def image_tokens(width: int | None, height: int | None) -> int:
    """OpenAI's estimate for a detailed image: 85 plus 170 per 512-pixel tile once scaled to fit 768 px short side."""
    if not width or not height:
        return 85
    scale = min(1.0, 768 / min(width, height))
    tiles = -(-int(width * scale) // 512) * -(-int(height * scale) // 512)
    return 85 + 170 * tiles


def sniff(data: bytes) -> str:
    """The file's type from its first bytes: pdf, docx, PNG, JPEG, WEBP, GIF, text; Unreadable otherwise."""
    if data.startswith(b"%PDF-"):
        return "pdf"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                if "word/document.xml" in archive.namelist():
                    return "docx"
        except zipfile.BadZipFile:
            raise Unreadable(gettext_noop("The Word document is damaged (its zip structure cannot be read).")) from None
        raise Unreadable(
            gettext_noop("This zip-based file is not a Word .docx document; attach it as PDF, .docx or text.")
        )
    if is_text(data):
        return "text"
    raise Unreadable(gettext_noop(
        "This file type is not supported: attach text or code, Markdown, CSV, JSON, PDF, Word .docx, "
        "or a PNG, JPEG, WebP or GIF image."
    ))  # fmt: skip


def is_text(data: bytes) -> bool:
    """UTF-8 (or UTF-16 with a byte-order mark) with no control characters but tab, newlines and form feed."""
    try:
        text = decode_text(data)
    except UnicodeDecodeError:
        return False
    return not any(ord(c) < 32 and c not in "\t\n\r\f" for c in text)


def decode_text(data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    return data.decode("utf-8-sig")


def inspect(data: bytes, max_side: int = MAX_SIDE) -> Inspected:
    """Sniff, then extract the text or re-encode the image; Unreadable with a sentence when it cannot."""
    kind = sniff(data)
    if kind == "text":
        return Inspected("document", kind, DOCUMENT_TYPES[kind], data, text=decode_text(data).replace("\r\n", "\n"))
    if kind == "pdf":
        return Inspected("document", kind, DOCUMENT_TYPES[kind], data, text=pdf_text(data))
    if kind == "docx":
        return Inspected("document", kind, DOCUMENT_TYPES[kind], data, text=docx_text(data))
    return reencode_image(data, kind, max_side)


def pdf_text(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unreadable(gettext_noop("The PDF is password-protected; attach an unprotected copy."))
        pages = [page.extract_text() or "" for page in reader.pages]
    except Unreadable:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, OSError, RecursionError) as exc:
        message = gettext_noop("The PDF could not be read (it looks damaged or truncated: %(error)s).")
        raise Unreadable(message, error=type(exc).__name__) from None
    text = "\n\n".join(page.strip() for page in pages if page.strip())
    if not text:
        raise Unreadable(
            gettext_noop("The PDF has no text to extract (a scan, perhaps); attach its pages as images instead.")
        )
    return text


def docx_text(data: bytes) -> str:
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
        lines = [paragraph.text for paragraph in document.paragraphs]
        for table in document.tables:
            for row in table.rows:
                lines.append(" | ".join(cell.text.strip() for cell in row.cells))
    except Exception as exc:  # zip, lxml and python-docx's own errors, without importing lxml here
        # The error's type (KeyError, XMLSyntaxError) tells a person nothing: what it means does.
        logging.getLogger(__name__).info("a Word document could not be read: %r", exc)
        message = gettext_noop("The Word document could not be read: it looks damaged, or is not a .docx file.")
        raise Unreadable(message) from None
    return "\n".join(lines).strip()


def reencode_image(data: bytes, kind: str, max_side: int = MAX_SIDE) -> Inspected:
    """Decode fully (a truncated file fails here), orient, drop metadata, fit in max_side, encode again."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # over twice this Pillow raises DecompressionBombError
    try:
        with Image.open(io.BytesIO(data), formats=[kind]) as image:
            if image.width * image.height > MAX_PIXELS:
                message = gettext_noop("The image is too large (%(width)s×%(height)s pixels).")
                raise Unreadable(message, width=image.width, height=image.height)
            image.seek(0)  # a GIF's (or animated WebP's) first frame
            image.load()
            frame = ImageOps.exif_transpose(image) or image
            frame.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
            out_format = OUTPUT_FORMAT[kind]
            if out_format == "JPEG" and frame.mode not in ("RGB", "L"):
                frame = frame.convert("RGB")
            elif frame.mode not in ("RGB", "RGBA", "L", "LA", "P"):
                frame = frame.convert("RGBA")
            buffer = io.BytesIO()
            options = {"quality": 90} if out_format in ("JPEG", "WEBP") else {"optimize": True}
            frame.save(buffer, format=out_format, **options)  # no exif=, no icc_profile=: metadata stays behind
            width, height = frame.size
    except Unreadable:
        raise
    except Image.DecompressionBombError:
        raise Unreadable(gettext_noop("The image is too large to decode.")) from None
    except UnidentifiedImageError:  # its message names the in-memory file object ("<_io.BytesIO object at 0x…>")
        raise Unreadable(gettext_noop("The image could not be read: it is not a %(kind)s image."), kind=kind) from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        message = gettext_noop("The image could not be read (it looks damaged or truncated: %(error)s).")
        raise Unreadable(message, error=str(exc)) from None
    content_type = IMAGE_TYPES[out_format]
    return Inspected("image", kind, content_type, buffer.getvalue(), width=width, height=height)


# --- in a child process, with a time and a memory limit ----------------------------------

_context = None


def _child(connection, data: bytes, max_side: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a damaged file's warnings say nothing the error does not
    try:
        connection.send(("ok", inspect(data, max_side)))
    except Unreadable as exc:
        connection.send(("unreadable", (exc.message, exc.params)))
    except MemoryError:
        connection.send(("unreadable", (gettext_noop("The file needs too much memory to read."), {})))
    except Exception as exc:  # anything else a crafted file provokes is still just an unreadable file
        logging.getLogger(__name__).info("a file could not be read: %r", exc)
        connection.send(("unreadable", (gettext_noop("The file could not be read: it looks damaged."), {})))
    finally:
        connection.close()


def inspect_limited(data: bytes, *, timeout: float, max_side: int = MAX_SIDE) -> Inspected:
    """inspect() in a forked child that is killed after `timeout` seconds. Blocking: call it off the event loop."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        # Forked from a server that has these imported already: a child starts in milliseconds.
        _context.set_forkserver_preload(["chat.lib.attachment_content", "pypdf", "docx", "PIL.Image"])
    receiver, sender = _context.Pipe(duplex=False)
    child = _context.Process(target=_child, args=(sender, data, max_side), daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            message = gettext_noop("Reading the file took longer than %(seconds)s s; it was given up.")
            raise Unreadable(message, seconds=f"{timeout:g}")
        try:
            outcome, value = receiver.recv()
        except EOFError:
            raise Unreadable(gettext_noop("The file could not be read (reading it ran out of memory).")) from None
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()
    if outcome != "ok":
        message, params = value
        raise Unreadable(message, **params)
    return value
