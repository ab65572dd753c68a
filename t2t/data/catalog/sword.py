"""SWORD commentary modules (zCom/zCom4, Debian ``sword-comm-*``) -> plain-text documents.

A module's testament is three files: ``.Xzs`` lists its compressed blocks (little-endian
uint32 offset, compressed size, uncompressed size, 12 bytes each), ``.Xzz`` holds the blocks
(zlib, ``CompressType=ZIP``), ``.Xzv`` indexes verses into them (not needed here: a block is
one book, ``BlockType=BOOK``, or one chapter, ``CHAPTER``, of commentary in OSIS or ThML
markup, and is taken whole as one document). `osis_text` strips the markup.
"""
from __future__ import annotations

import html
import re
import struct
import zlib

_BREAK = re.compile(r"<(?:div|p|lb|title|l|lg|item|list|br|chapter|verse)\b[^>]*>|"
                    r"</(?:div|p|title|l|lg|item|list)>", re.I)
_DROP = re.compile(r"<(note|rdg|scripRef)\b[^>]*>.*?</\1>", re.S | re.I)
_TAG = re.compile(r"<[^>]*>")


def zcom_blocks(index: bytes, data: bytes) -> list[str]:
    """The decompressed blocks of one testament, in order (empty ones skipped)."""
    blocks = []
    for i in range(0, len(index) - len(index) % 12, 12):
        offset, size, _ = struct.unpack("<3I", index[i:i + 12])
        if size:
            blocks.append(zlib.decompress(data[offset:offset + size]).decode("utf-8", "replace"))
    return blocks


def osis_text(markup: str) -> str:
    """OSIS/ThML -> paragraphs: block elements and milestones break paragraphs, notes and
    variant readings are dropped, other tags keep their text."""
    text = _TAG.sub("", _BREAK.sub("\n\n", _DROP.sub("", markup)))
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", html.unescape(text)))
    return "\n".join(p for p in paragraphs if p)
