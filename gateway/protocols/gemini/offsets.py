"""UTF-8 byte offsets (what Gemini's `segment.startIndex` / `endIndex` count) and Python str
offsets (what claims count), converted both ways in non-ASCII text."""

from __future__ import annotations

__all__ = ["byte_len", "to_bytes", "to_chars"]


def byte_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def to_bytes(text: str, index: int) -> int:
    """The UTF-8 byte offset of str offset `index` (0 <= index <= len(text))."""
    if text.isascii():
        return index
    return byte_len(text[:index])


def to_chars(text: str, offset: int) -> int | None:
    """The str offset of UTF-8 byte `offset` in `text`, or None when the offset is outside the
    text or falls inside a character's encoding (such an offset locates nothing)."""
    if offset < 0:
        return None
    if text.isascii():
        return offset if offset <= len(text) else None
    raw = text.encode("utf-8", "surrogatepass")
    if offset > len(raw):
        return None
    if offset < len(raw) and (raw[offset] & 0xC0) == 0x80:
        return None  # a continuation byte: the middle of a character
    return len(raw[:offset].decode("utf-8", "surrogatepass"))
