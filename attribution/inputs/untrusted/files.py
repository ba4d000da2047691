"""A file's bytes, read within the size limit; its format, recognised from its content; a zip
archive, opened only after its directory and every entry were checked.

Threats: a file larger than the machine should take (`read_source` reads at most
`MAX_UPLOAD_BYTES`, or `max_bytes`, and a path's size is checked before it is read); a file
named for one format holding another (`sniff` reads the first bytes, never the name); a zip
bomb or a crafted archive (`open_zip`: the entry count and the unpacked sizes its directory
declares within `Limits` before any entry is read; then every entry inflated once, in 1 MB
steps, refused as soon as it yields more than it declares, and its size and CRC compared;
the directory's entries counted by a bounded parse of the directory itself, not taken from
the count the file states; names that are not text or that denote one path twice,
encryption and compressions other than deflate refused).
"""
from __future__ import annotations

import io
import os
import posixpath
import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

from ...errors import AttributionError, reading
from .limits import DEFAULT_LIMITS, MAX_UPLOAD_BYTES, MB, Limits, over_budget

Source = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]


def read_source(source: Source, *, max_bytes: Optional[int] = None, what: str = "file"
                ) -> tuple[bytes, str]:
    """(content, display name) of a path, bytes or binary file object, within the size limit."""
    limit = MAX_UPLOAD_BYTES if max_bytes is None else max_bytes
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), f"the uploaded {what}"
    elif isinstance(source, (str, os.PathLike)):
        with open_path(source, max_bytes=max_bytes, what=what) as stream:
            data, name = stream.read(), Path(source).name
    elif hasattr(source, "getvalue") or hasattr(source, "read"):
        data = source.getvalue() if hasattr(source, "getvalue") else source.read(limit + 1)
        if not isinstance(data, (bytes, bytearray)):
            raise AttributionError(f"The {what} must be opened in binary mode ('rb').")
        data, name = bytes(data), str(getattr(source, "name", f"the uploaded {what}"))
    else:
        raise AttributionError(f"A {what} must be a path, bytes or a binary file object; got "
                               f"{type(source).__name__}.")
    if len(data) > limit:
        raise _too_large(name, len(data), limit)
    if not data:
        raise AttributionError(f"{name} is empty (0 bytes); upload the file again.")
    return data, name


def open_path(path: Union[str, os.PathLike], *, max_bytes: Optional[int] = None,
              what: str = "file") -> BinaryIO:
    """The file at `path` opened for reading, within the size limit (as `read_source`), for
    readers that take what they need in steps rather than the whole file at once."""
    limit = MAX_UPLOAD_BYTES if max_bytes is None else max_bytes
    path = Path(path)
    stream = open_regular(path, what)
    size = os.fstat(stream.fileno()).st_size
    if size > limit or not size:
        stream.close()
        if size:
            raise _too_large(path.name, size, limit)
        raise AttributionError(f"{path.name} is empty (0 bytes); upload the file again.")
    return stream


def open_regular(path: Union[str, os.PathLike], what: str = "file") -> BinaryIO:
    """The regular file at `path`, opened for reading without blocking: a pipe (FIFO), a
    device or a socket is refused (reading one can wait forever or never end), and so is a
    path that is not there. What is checked is the file opened, not the name."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise AttributionError(f"No such {what} file: {path}.") from None
    except OSError as error:
        raise AttributionError(f"Cannot open the {what} file {path}: "
                               f"{error.strerror or error}.") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        kind = ("a folder" if stat.S_ISDIR(mode) else "a pipe (FIFO)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device")
        raise AttributionError(f"The {what} {path} is {kind}, not a regular file; give a "
                               "file.")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def _too_large(name: str, size: int, limit: int) -> AttributionError:
    return AttributionError(
        f"{name} is {size / 2**20:.1f} MiB, over the {limit / 2**20:.1f} MiB limit. Raise the "
        "limit (max_bytes=..., or the app's start-up setting) on your own machine, or use the "
        "command line with a memory-mapped .npy for large data.")


# ---------------------------------------------------------------- the format, from the content

_MAGIC = (  # (prefix, format) for formats recognised only to explain what they are
    (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"%PDF", "a PDF document"), (b"\x1f\x8b", "a gzip archive"), (b"BZh", "a bzip2 archive"),
    (b"\x89HDF", "an HDF5 file (Keras .h5?)"), (b"7z\xbc\xaf", "a 7-zip archive"),
)


def sniff(data: bytes, size: Optional[int] = None) -> str:
    """The container format of `data` (a file's bytes, or its first 4 KiB when `size` gives
    the file's size) from its first bytes.

    Returns one of "zip", "pickle", "safetensors", "npy", "parquet", "text", or a phrase such
    as "a PNG image" for a recognised format that is neither a model nor data.
    """
    size = len(data) if size is None else size
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if data[:6] == b"\x93NUMPY":
        return "npy"
    if data[:4] == b"PAR1":
        return "parquet"
    if len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5:
        return "pickle"
    if size > 9 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") <= size - 8:
        return "safetensors"
    for prefix, description in _MAGIC:
        if data.startswith(prefix):
            return description
    sample = data[:4096]
    try:
        sample.decode("utf-8")
        return "text"
    except UnicodeDecodeError as error:
        if error.start >= len(sample) - 3 and size > len(sample):
            return "text"  # a multi-byte character cut by the 4 KiB sample
    return "binary"


def describe_kind(kind: str) -> str:
    """A format of `sniff` or `zip_kind` in words, for messages."""
    return {
        "npz": "a NumPy .npz data file", "npy": "a NumPy .npy array", "zip": "a zip archive "
        "that is not a PyTorch checkpoint", "parquet": "a Parquet table", "text": "a text file",
        "binary": "an unrecognised binary file", "torch.export": "a torch.export program",
        "torchscript": "a TorchScript archive",
    }.get(kind, kind)


# ---------------------------------------------------------------- zip archives

Archive = Union[bytes, BinaryIO]
"""A zip archive's bytes, or a binary file open on it (read in steps, never whole)."""


def _stream(data: Archive) -> BinaryIO:
    """`data` as a seekable binary stream, without a copy."""
    return io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data


def _read_at(data: Archive, offset: int, length: int) -> bytes:
    """At most `length` bytes of `data` from `offset`."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data[offset:offset + length])
    data.seek(offset)
    return data.read(length)


def _chunks(data: Archive, offset: int, length: int, step: int = 1 << 20) -> Iterator[bytes]:
    """`length` bytes of `data` from `offset`, `step` bytes at a time (fewer where it ends)."""
    for start in range(offset, offset + length, step):
        chunk = _read_at(data, start, min(step, offset + length - start))
        if not chunk:
            return
        yield chunk


def zip_entry_names(data: Archive, limits: Optional[Limits] = None) -> list[str]:
    """The entry names of a zip archive, read from its central directory by a bounded parse
    before anything else reads it: entries are counted from the directory itself (the end
    record's count is the file's claim), at most `max_archive_entries`; each name must be
    valid text; two names that normalise to one path (`a/../b` and `b`, `\\` and `/`) are
    refused."""
    limits = limits or DEFAULT_LIMITS
    with reading("The file looks like a zip archive but is damaged or truncated"):
        end_record = zipfile._EndRecData(_stream(data))
    if end_record is None:
        raise AttributionError("The zip archive is damaged or truncated (it has no "
                               "directory); upload the file again.")
    size, offset = end_record[zipfile._ECD_SIZE], end_record[zipfile._ECD_OFFSET]
    position = end_record[zipfile._ECD_LOCATION] - size  # as zipfile: data may precede it
    if end_record[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        position -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    if position < 0 or offset > position:
        raise AttributionError("The zip archive's directory lies outside the file; it is "
                               "damaged or crafted. Save the file again.")
    directory, base = _read_at(data, position, size), position  # within the file's size
    names, stop = [], position + size
    while position < stop:
        if len(names) == limits.max_archive_entries:
            raise AttributionError(over_budget(
                "The zip archive lists", f"more than {len(names):,} entries",
                f"{limits.max_archive_entries:,}", "max_archive_entries"))
        header = directory[position - base:position - base + zipfile.sizeCentralDir]
        if len(header) < zipfile.sizeCentralDir or header[:4] != zipfile.stringCentralDir:
            raise AttributionError("The zip archive's directory is damaged or truncated; "
                                   "upload the file again.")
        fields = struct.unpack(zipfile.structCentralDir, header)
        start = position + zipfile.sizeCentralDir
        raw = directory[start - base:start - base + fields[zipfile._CD_FILENAME_LENGTH]]
        try:
            names.append(raw.decode("utf-8" if fields[zipfile._CD_FLAG_BITS] & 0x800
                                    else "cp437"))
        except UnicodeDecodeError:
            raise AttributionError(f"The zip entry name {raw[:60]!r} is marked UTF-8 but is "
                                   "not; the archive is damaged or crafted.") from None
        position = start + sum(fields[i] for i in (zipfile._CD_FILENAME_LENGTH,
                                                   zipfile._CD_EXTRA_FIELD_LENGTH,
                                                   zipfile._CD_COMMENT_LENGTH))
    if len({_normalised(name) for name in names}) != len(names):
        raise AttributionError("The zip archive lists one entry twice (under names that "
                               "denote the same path); it is damaged or crafted. Save the "
                               "file again.")
    return names


def _normalised(name: str) -> str:
    return posixpath.normpath("/" + name.replace("\\", "/")).lstrip("/")


def zip_directory(data: Archive, limits: Optional[Limits] = None) -> zipfile.ZipFile:
    """Python's zipfile on `data`, opened only after the bounded parse of `zip_entry_names`
    accepted its directory (zipfile itself reads every entry the directory holds); no entry
    is read. The one way this package opens a zip it did not write."""
    zip_entry_names(data, limits)
    with reading("The file looks like a zip archive but is damaged or truncated"):
        return zipfile.ZipFile(_stream(data))


def open_zip(data: Archive, limits: Optional[Limits] = None) -> zipfile.ZipFile:
    """A checked zip archive: its directory read by a bounded parse (`zip_directory`) and
    the unpacked sizes it declares within `limits` (before any entry is read), then every
    entry inflated once, in 1 MB steps, and refused as soon as it yields more than it
    declares, or when its size or CRC differ at the end."""
    limits = limits or DEFAULT_LIMITS
    archive = zip_directory(data, limits)
    with reading("The file looks like a zip archive but is damaged or truncated"):
        entries = archive.infolist()
        unpacked = sum(entry.file_size for entry in entries)
        if unpacked > limits.max_decoded_bytes:
            raise AttributionError(over_budget(
                "The zip archive unpacks to", f"{unpacked / MB:,.0f} MB",
                f"{limits.max_decoded_bytes / MB:,.0f} MB", "max_decoded_bytes"))
        spans = sorted(_verify_entry(data, entry) for entry in entries)
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if start < end:  # one entry's bytes inside another's: a zip bomb's construction
            raise AttributionError(
                f"The zip entries {name[:60]!r} and {other[:60]!r} share bytes (one lies "
                "inside the other); the archive is crafted, and was refused.")
    return archive


_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # signature ... name length, extra length


def _verify_entry(data: Archive, entry: zipfile.ZipInfo) -> tuple[int, int, str]:
    """Inflate one entry from the archive's bytes, stopping as soon as it exceeds the size
    it declares; its size and CRC must then match the directory. Returns the bytes it spans,
    (start of its local header, end of its data, its name)."""
    if entry.flag_bits & 0x1 or entry.compress_type not in (zipfile.ZIP_STORED,
                                                            zipfile.ZIP_DEFLATED):
        raise AttributionError(f"The zip entry {entry.filename[:80]!r} is encrypted or uses "
                               "a compression other than deflate; save the file again with "
                               "numpy or torch.")
    header = _read_at(data, entry.header_offset, _LOCAL_HEADER.size)
    fields = _LOCAL_HEADER.unpack(header) if len(header) == _LOCAL_HEADER.size else (b"",)
    if fields[0] != b"PK\x03\x04":
        raise AttributionError(f"The zip entry {entry.filename[:80]!r} has no local header; "
                               "the archive is damaged. Upload the file again.")
    start = entry.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
    deflated = entry.compress_type == zipfile.ZIP_DEFLATED
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    packed = produced = crc = 0
    for chunk in _chunks(data, start, entry.compress_size):  # 1 MB read at a time
        packed += len(chunk)
        pending = chunk
        while pending:
            out = inflater.decompress(pending, 1 << 20) if deflated else pending
            produced, crc = produced + len(out), zlib.crc32(out, crc)
            if produced > entry.file_size:
                raise AttributionError(
                    f"The zip entry {entry.filename[:80]!r} unpacks to more than the "
                    f"{entry.file_size:,} bytes its header declares; the archive is damaged "
                    "or crafted, and was not unpacked further.")
            pending = inflater.unconsumed_tail if deflated else b""
            if deflated and (inflater.eof or not out):
                break
        if deflated and inflater.eof:
            break
    finished = inflater.eof if deflated else produced == entry.file_size
    if packed != entry.compress_size and not (deflated and inflater.eof) or not finished \
            or produced != entry.file_size or crc != entry.CRC:
        raise AttributionError(f"The zip archive is damaged (entry {entry.filename[:80]!r} is "
                               "truncated or fails its checksum); upload the file again.")
    return entry.header_offset, start + entry.compress_size, entry.filename


def zip_kind(archive: zipfile.ZipFile) -> str:
    """"torch.export", "torchscript", "torch.save", "npz" or "zip" (something else)."""
    names = archive.namelist()
    roots = {name.split("/", 1)[0] for name in names}
    inner = {name.split("/", 1)[1] for name in names if "/" in name} if len(roots) == 1 else set()
    if "archive_format" in inner:
        return "torch.export"
    if "constants.pkl" in inner or any(name.startswith("code/") for name in inner):
        return "torchscript"
    if "data.pkl" in inner:
        return "torch.save"
    if names and all(name.endswith(".npy") for name in names):
        return "npz"
    return "zip"
