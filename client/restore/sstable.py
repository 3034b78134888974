"""TensorFlow's table files (LevelDB's SSTable format), read in pure Python.

A checkpoint's ``.index`` is such a table (see :mod:`adaptd.client.restore.verify`): a footer
with a magic number and the index block's handle, blocks of prefix-compressed
entries, each block followed by its compression byte and a masked CRC32C. This
reader checks every block's checksum, so a damaged index is reported as such.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

__all__ = ["crc32c", "read_index"]

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48  # two block handles padded to 40 bytes, then the 8-byte magic
_BLOCK_TRAILER = 5  # compression type byte + masked CRC32C


class _IndexError(Exception):
    """The index cannot be parsed; the message says where and why."""


# --------------------------------------------------------------------------- CRC32C


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TensorFlow's tables and bundles use. Pure Python:
    fine for index files (about 100 bytes per tensor); TF checks the data itself."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _unmask(masked: int) -> int:
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# --------------------------------------------------------------------------- the index (SSTable)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _IndexError("malformed varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _block(data: bytes, offset: int, size: int, what: str) -> bytes:
    end = offset + size + _BLOCK_TRAILER
    if offset < 0 or end > len(data):
        raise _IndexError(f"{what} block at byte {offset} runs past the end of the file")
    contents = data[offset : offset + size]
    kind = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if _unmask(stored) != crc32c(contents + bytes([kind])):
        raise _IndexError(f"{what} block at byte {offset}: checksum mismatch")
    if kind != 0:
        raise _IndexError(f"{what} block at byte {offset}: compression type {kind} unsupported")
    return contents


def _entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise _IndexError("block too short")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 - 4 * restarts
    if limit < 0:
        raise _IndexError("block restart array is larger than the block")
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        vlen, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + vlen > limit:
            raise _IndexError("block entry overruns the block")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + vlen]
        pos += vlen


def read_index(path: str | os.PathLike[str]) -> list[tuple[bytes, bytes]]:
    """All ``(key, value)`` pairs of a TensorFlow SSTable file, in key order.

    Every block's checksum is verified. Raises :class:`ValueError` naming the
    problem (too short, bad magic, checksum mismatch, malformed block) and
    :class:`OSError` when the file cannot be read.
    """
    data = Path(path).read_bytes()
    try:
        if len(data) < _FOOTER_LEN:
            raise _IndexError(f"{len(data)} bytes, shorter than a table footer")
        footer = data[-_FOOTER_LEN:]
        (magic,) = struct.unpack_from("<Q", footer, 40)
        if magic != _TABLE_MAGIC:
            raise _IndexError("not a TensorFlow table (bad magic number in the footer)")
        _, pos = _varint(footer, 0)  # metaindex offset
        _, pos = _varint(footer, pos)  # metaindex size
        idx_off, pos = _varint(footer, pos)
        idx_size, _ = _varint(footer, pos)
        out: list[tuple[bytes, bytes]] = []
        for _, handle in _entries(_block(data, idx_off, idx_size, "index")):
            off, p = _varint(handle, 0)
            size, _ = _varint(handle, p)
            out.extend(_entries(_block(data, off, size, "data")))
        return out
    except _IndexError as exc:
        raise ValueError(str(exc)) from None
