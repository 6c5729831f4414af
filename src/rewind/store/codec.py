"""How a blob's bytes are kept in the ``blobs.data`` column (the ``codec`` column names it).

The hash of a blob is always the sha256 of its *uncompressed* bytes: a codec changes only how
many bytes a row takes, never a hash, a cache key or what a reader gets back.

- ``raw``: the bytes as they are (small blobs, and anything that does not shrink by 10%).
- ``zlib``: zlib (RFC 1950) of the bytes; blobs of :data:`COMPRESS_MIN_BYTES` or more.
- ``zd1``: raw DEFLATE (RFC 1951, 2 KiB window) primed with the preset dictionary
  :data:`ZDICT_V1`: the JSON shapes Rewind stores most (its node input and state map documents,
  OpenAI-style chat requests and responses). Most blobs of a traced chain are a few hundred
  bytes, too short for plain zlib to find repeats in; the dictionary supplies them (measured on
  peerbench's 100-step trace: 173 KB of blobs under 1 KiB → 82 KB, ≈ 9 µs a blob). **The dictionary
  is frozen**: a store written with it must read back forever, so a better dictionary gets a
  new codec name (``zd2``...) and this one stays.
- ``hex1``: every run of 64 lowercase hex digits (a sha256, as Rewind's documents name blobs)
  replaced by a NUL byte and the 32 bytes it spells; only for bytes without a NUL of their own
  (JSON text never has one), so every NUL of the stored bytes starts a digest. Rewind's
  ``{field: hash}`` maps (node outputs, state maps: a third of a traced step's blobs) are
  mostly hash and compress badly; this halves them. Added by migration 0011.
- ``p-raw`` / ``p-hex1``: the blob is a slice of a pack (``blob_packs``: small blobs of one
  traced chain's write read together — its documents, or its calls' payloads —,
  zlib-compressed together; :func:`pack_together`); handled by the store. Added by migration
  0012. Since migration 0016 most packed blobs have no ``blobs`` row: a ``blob_slices`` row
  keyed by the first :data:`SLICE_KEY_BYTES` bytes of the hash names the slice
  (:func:`slice_ref`).
- ``object``: the bytes live in the object store (see :mod:`rewind.store.objects`); handled by
  the store, not here.
"""

from __future__ import annotations

import re
import zlib

COMPRESS_MIN_BYTES = 1024
"""Blobs at least this large are stored zlib-compressed when that saves 10% or more."""
DICT_MIN_BYTES = 64
"""Blobs from this size up to :data:`COMPRESS_MIN_BYTES` are tried with the ``zd1`` codec."""
_WBITS = -11  # raw deflate, 2 KiB window: holds the dictionary and a blob under COMPRESS_MIN_BYTES
_MEM_LEVEL = 4

ZDICT_V1 = (
    # OpenAI-style chat completion responses as servers send them (spaced and compact)
    b'{"id":"chatcmpl-","object":"chat.completion","created":,"model":"gpt-4o-mini",'
    b'"system_fingerprint":"fp_","service_tier":"default","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"","refusal":null,"annotations":[]},"logprobs":null,'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":,"completion_tokens":,"total_tokens":,'
    b'"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":'
    b'{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,'
    b'"rejected_prediction_tokens":0}}}'
    b'{"id": "chatcmpl-", "object": "chat.completion", "created": , "model": "", '
    b'"system_fingerprint": "fp_", "choices": [{"index": 0, "message": {"role": "assistant", '
    b'"content": "", "refusal": null}, "logprobs": null, "finish_reason": "stop"}], "usage": '
    b'{"prompt_tokens": , "completion_tokens": , "total_tokens": }}'
    # tool calls in requests and responses
    b'"tool_calls":[{"id":"call_","type":"function","function":{"name":"","arguments":"{\\"'
    b'"tools":[{"type":"function","function":{"name":"","description":"","parameters":'
    b'{"type":"object","properties":{"":{"type":"string","description":""}},"required":[]}}}]'
    # canonical chat requests (sorted keys, compact separators)
    b'{"frequency_penalty":0.0,"logprobs":false,"max_tokens":,"messages":[{"content":"",'
    b'"role":"system"},{"content":"","role":"user"},{"content":"","role":"assistant"}],'
    b'"model":"","n":1,"presence_penalty":0.0,"response_format":{"type":"json_object"},'
    b'"seed":null,"stop":null,"stream":false,"temperature":0.0,"tool_choice":"auto","top_p":1.0}'
    # Rewind's own documents: a node's input document, {field: hash} maps, typed values
    b'{"__rewind_type__":"","value":{"args":[],"kwargs":{}},"result":'
    b'{"inputs":{"max_tokens":,"messages":[{"content":"","role":"system"},{"content":"",'
    b'"role":"user"}],"model":"","temperature":0},"node":"","params":{},"reads":{"":"'
)
"""The ``zd1`` preset dictionary. Frozen: never edit it (see the module docstring)."""
_PRIMED = zlib.compressobj(6, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, ZDICT_V1)


_HEX64 = re.compile(rb"[0-9a-f]{64}")


def pack(data: bytes) -> tuple[str, bytes]:
    """The codec name and stored bytes for a blob's bytes (the smallest of the codecs tried).

    Args:
        data: the blob's uncompressed bytes.
    Returns:
        (``raw`` | ``zlib`` | ``zd1`` | ``hex1``, the bytes to store in ``blobs.data``).
    """
    size = len(data)
    codec, packed = "raw", data
    if size >= COMPRESS_MIN_BYTES:
        z = zlib.compress(data, 6)
        if len(z) <= size * 0.9:
            codec, packed = "zlib", z
    elif size >= DICT_MIN_BYTES:
        c = _PRIMED.copy()  # cheaper than loading the dictionary into a new compressor
        z = c.compress(data) + c.flush()
        if len(z) <= size * 0.9:
            codec, packed = "zd1", z
    if size >= 64 and b"\0" not in data and _HEX64.search(data) is not None:
        h = _HEX64.sub(_digest_bytes, data)
        if len(h) < len(packed):
            codec, packed = "hex1", h
    return codec, packed


def _digest_bytes(match: re.Match[bytes]) -> bytes:
    return b"\0" + bytes.fromhex(match.group().decode("ascii"))


def _hex_runs(packed: bytes) -> bytes:
    """``hex1``'s stored bytes back to the blob's bytes."""
    out: list[bytes] = []
    i = 0
    while (j := packed.find(b"\0", i)) >= 0:
        digest = packed[j + 1 : j + 33]
        if len(digest) != 32:
            raise ValueError("hex1 bytes end inside a digest")
        out.append(packed[i:j])
        out.append(digest.hex().encode("ascii"))
        i = j + 33
    out.append(packed[i:])
    return b"".join(out)


def unpack(codec: str, data: bytes) -> bytes:
    """A blob's uncompressed bytes from its stored bytes.

    Raises:
        ValueError: an unknown codec (a store written by a newer Rewind), ``object`` (the
            store reads those from the object store), or damaged ``hex1`` bytes.
        zlib.error: damaged bytes.
    """
    if codec == "raw":
        return bytes(data)
    if codec == "zd1":
        d = zlib.decompressobj(_WBITS, ZDICT_V1)
        return d.decompress(data) + d.flush()
    if codec == "zlib":
        return zlib.decompress(data)
    if codec == "hex1":
        return _hex_runs(bytes(data))
    raise ValueError(f"unknown blob codec {codec!r}")


# -- packs: many small blobs of one write in one compressed row (migration 0012) -------------

PACK_PREFIX = "p-"
"""``blobs.codec`` of a blob kept inside a pack (``blob_packs``): ``p-raw`` or ``p-hex1`` (how
its slice of the pack's uncompressed bytes is kept); ``blobs.data`` is :func:`pack_ref`."""
PACK_MAX_BYTES = 4096
"""Blobs larger than this are never packed (they compress well enough alone)."""


def pack_together(items: list[bytes]) -> tuple[bytes, list[tuple[str, int, int]]]:
    """Pack blobs' bytes together: (the pack's stored bytes — zlib of the concatenated slices —,
    per item its ``p-`` codec, offset and length in the uncompressed pack). A slice is the
    item's ``hex1`` form when that is shorter, else its bytes: a document of Rewind's is mostly
    sha256 hex, and the same digests repeat from one document to the next (zlib finds them)."""
    parts: list[bytes] = []
    out: list[tuple[str, int, int]] = []
    offset = 0
    for data in items:
        codec, stored = "raw", data
        if b"\0" not in data and _HEX64.search(data) is not None:
            h = _HEX64.sub(_digest_bytes, data)
            if len(h) < len(data):
                codec, stored = "hex1", h
        parts.append(stored)
        out.append((PACK_PREFIX + codec, offset, len(stored)))
        offset += len(stored)
    return zlib.compress(b"".join(parts), 6), out


def pack_ref(pack_id: int, offset: int, length: int) -> bytes:
    """``blobs.data`` of a packed blob: three unsigned LEB128 varints (pack id, offset, length)."""
    return _varint(pack_id) + _varint(offset) + _varint(length)


def read_pack_ref(data: bytes) -> tuple[int, int, int]:
    """(pack id, offset, length) from :func:`pack_ref` bytes.

    Raises:
        ValueError: not three varints.
    """
    values = _read_varints(data)
    if len(values) != 3:
        raise ValueError("a packed blob's reference is not three varints")
    return values[0], values[1], values[2]


SLICE_KEY_BYTES = 8
"""Bytes of a packed blob's sha256 that key its ``blob_slices`` row (migration 0016). Two blobs
may share them (by chance, or made to: ~2^32 sha256 evaluations find such a pair): the first
stored keeps the ``blob_slices`` row, any other is a ``blobs`` row under its full hash, and a
reader checks the bytes a key names against the whole hash."""


def slice_key(digest: str) -> bytes:
    """The ``blob_slices.key`` of a blob's sha256 hex: its first :data:`SLICE_KEY_BYTES` bytes."""
    return bytes.fromhex(digest[: 2 * SLICE_KEY_BYTES])


def slice_ref(codec: str, pack_id: int, offset: int, length: int, size: int) -> bytes:
    """``blob_slices.ref`` of a packed blob: unsigned LEB128 varints (pack id, offset, length),
    and for a ``p-hex1`` slice a fourth, the blob's size in bytes (a ``p-raw`` slice's size is
    its length).

    Raises:
        ValueError: ``codec`` is not ``p-raw`` or ``p-hex1``.
    """
    ref = pack_ref(pack_id, offset, length)
    if codec == PACK_PREFIX + "raw":
        return ref
    if codec == PACK_PREFIX + "hex1":
        return ref + _varint(size)
    raise ValueError(f"unknown blob codec {codec!r}")


def read_slice_ref(data: bytes) -> tuple[str, int, int, int, int]:
    """(``p-`` codec, pack id, offset, length, size in bytes) from :func:`slice_ref` bytes.

    Raises:
        ValueError: not three or four varints.
    """
    values = _read_varints(data)
    if len(values) == 3:
        return PACK_PREFIX + "raw", values[0], values[1], values[2], values[2]
    if len(values) == 4:
        return PACK_PREFIX + "hex1", values[0], values[1], values[2], values[3]
    raise ValueError("a packed blob's slice reference is not three or four varints")


def _read_varints(data: bytes) -> list[int]:
    """The unsigned LEB128 varints of ``data``; ValueError when it ends inside one."""
    values: list[int] = []
    value = shift = 0
    for byte in bytes(data):
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            values.append(value)
            value = shift = 0
    if shift:
        raise ValueError("a packed blob's reference ends inside a varint")
    return values


def unpack_slice(codec: str, plain: bytes, offset: int, length: int) -> bytes:
    """A packed blob's bytes from its pack's uncompressed bytes.

    Raises:
        ValueError: an unknown ``p-`` codec, a slice outside the pack, or damaged ``hex1``.
    """
    if offset + length > len(plain):
        raise ValueError("a packed blob's slice ends outside its pack")
    part = plain[offset : offset + length]
    inner = codec[len(PACK_PREFIX) :]
    if inner not in ("raw", "hex1"):
        raise ValueError(f"unknown blob codec {codec!r}")
    return unpack(inner, part)


_BYTE = [bytes((i,)) for i in range(0x80)]


def _varint(n: int) -> bytes:
    # one or two bytes without the loop: every length and most offsets and pack ids of a pack
    # (one reference per packed blob)
    if n < 0x80:
        return _BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
