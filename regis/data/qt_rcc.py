"""A reader of Qt binary resource bundles (``.rcc`` files, what ``rcc --binary`` writes): list and read the files
inside without Qt.

Format (Qt's ``rcc.cpp`` / ``qresource.cpp``; big-endian throughout):

- header: ``b"qres"``, format version (uint32, 1-3), tree offset, data offset, names offset (uint32 each),
  and for version >= 3 a uint32 of overall flags;
- tree: fixed-size nodes (14 bytes in version 1, 22 from version 2: + a uint64 modification time), node 0 is the
  root directory. A node: name offset (uint32, into names), flags (uint16: 1 zlib-compressed, 2 directory,
  4 zstd-compressed), then for a directory: child count and index of the first child node (uint32 each); for a
  file: country and language (uint16 each) and data offset (uint32, into data);
- names: uint16 length (UTF-16 code units), uint32 hash, the UTF-16-BE name;
- data: uint32 length, then the bytes. zlib-compressed data is Qt's ``qCompress`` layout (uint32 uncompressed
  size, then a zlib stream); zstd-compressed data is a zstd frame.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from regis.errors import ConfigError

MAGIC = b"qres"
FLAG_ZLIB, FLAG_DIRECTORY, FLAG_ZSTD = 1, 2, 4


class RccFormatError(ConfigError):
    """The file is not a Qt binary resource bundle, or it is truncated or corrupt."""


@dataclass(frozen=True)
class RccEntry:
    """One file in a bundle.

    Attributes:
        path: its resource path, "/"-separated, without the leading ":/" (e.g. "gcompris/src/.../tiger.webp").
        flags: the node's flags (``FLAG_ZLIB``, ``FLAG_ZSTD``).
        data_offset: where its length-prefixed bytes start, relative to the bundle's data section.
    """

    path: str
    flags: int
    data_offset: int


class RccBundle:
    """A ``.rcc`` file in memory: ``entries()`` lists its files, ``read(entry)`` returns one file's bytes.

    Raises (constructor):
        RccFormatError: wrong magic, unknown version, offsets outside the file.
    """

    def __init__(self, data: bytes, name: str = "<bytes>"):
        self.data, self.name = data, name
        if len(data) < 20 or data[:4] != MAGIC:
            raise RccFormatError(f"{name} is not a Qt resource bundle (no 'qres' header)")
        self.version, self.tree, self.payload, self.names = struct.unpack_from(">IIII", data, 4)
        if self.version not in (1, 2, 3):
            raise RccFormatError(f"{name}: unsupported rcc format version {self.version}")
        if max(self.tree, self.payload, self.names) >= len(data):
            raise RccFormatError(f"{name}: section offsets point past the end of the file (truncated?)")
        self.node_size = 14 if self.version == 1 else 22

    @classmethod
    def open(cls, path: Path | str) -> RccBundle:
        """Read a bundle from disk."""
        return cls(Path(path).read_bytes(), str(path))

    def _unpack(self, fmt: str, offset: int) -> tuple:
        try:
            return struct.unpack_from(fmt, self.data, offset)
        except struct.error as exc:
            raise RccFormatError(f"{self.name}: truncated at byte {offset}") from exc

    def _name(self, offset: int) -> str:
        (length,) = self._unpack(">H", self.names + offset)
        start = self.names + offset + 6
        raw = self.data[start : start + 2 * length]
        if len(raw) != 2 * length:
            raise RccFormatError(f"{self.name}: truncated name at byte {start}")
        return raw.decode("utf-16-be")

    def entries(self) -> list[RccEntry]:
        """Every file in the bundle, depth-first in tree order.

        Raises:
            RccFormatError: a node or name lies outside the file, or the tree has a cycle.
        """
        out: list[RccEntry] = []
        stack: list[tuple[int, str]] = [(0, "")]
        seen: set[int] = set()
        while stack:
            node, prefix = stack.pop()
            if node in seen:
                raise RccFormatError(f"{self.name}: the resource tree has a cycle at node {node}")
            seen.add(node)
            base = self.tree + node * self.node_size
            name_off, flags = self._unpack(">IH", base)
            name = "" if node == 0 else self._name(name_off)
            path = f"{prefix}/{name}" if prefix else name
            if flags & FLAG_DIRECTORY:
                count, first = self._unpack(">II", base + 6)
                stack.extend((first + i, path) for i in reversed(range(count)))
            else:
                (data_off,) = self._unpack(">I", base + 10)
                out.append(RccEntry(path, flags, data_off))
        return out

    def read(self, entry: RccEntry) -> bytes:
        """The (decompressed) bytes of one file.

        Raises:
            RccFormatError: truncated or corrupt data; zstd data without the ``zstandard`` package.
        """
        start = self.payload + entry.data_offset
        (length,) = self._unpack(">I", start)
        blob = self.data[start + 4 : start + 4 + length]
        if len(blob) != length:
            raise RccFormatError(f"{self.name}: {entry.path} is truncated")
        if entry.flags & FLAG_ZSTD:
            try:
                import zstandard
            except ImportError as exc:
                raise RccFormatError(f"{self.name}: {entry.path} is zstd-compressed; pip install zstandard") from exc
            return zstandard.ZstdDecompressor().decompressobj().decompress(blob)
        if entry.flags & FLAG_ZLIB:
            try:
                return zlib.decompress(blob[4:])  # qCompress: uint32 uncompressed size, then zlib
            except zlib.error as exc:
                raise RccFormatError(f"{self.name}: {entry.path} has corrupt zlib data") from exc
        return blob
