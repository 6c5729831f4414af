"""Object storage for large blobs, by URL, through fsspec (``s3://bucket/prefix`` via s3fs,
``file:///folder``; GCS and Azure drop in the same way with their fsspec packages).

The database keeps a blob's sha256 and a reference (the object's full URL); the bytes live at
``<url>/blobs/<first two hex>/<sha256>``. Objects are immutable by construction: a key is the hash
of its content, so writing one twice writes the same bytes. Every read is verified against the
hash, because an object store is outside the database's transactions and its objects can be
edited or truncated by anyone holding the bucket's credentials.

Credentials and endpoints come from the usual places of each backend (for S3: ``AWS_*``
variables, ``~/.aws``, and fsspec's ``FSSPEC_S3_ENDPOINT_URL`` for an S3-compatible server).
"""

from __future__ import annotations

from typing import Any

from rewind.canonical import sha256_hex
from rewind.errors import StoreError

OFFLOAD_MIN_BYTES = 64 * 1024
"""Blobs at least this large (bytes, uncompressed) go to the object store when one is set;
smaller ones stay in the database, where a row costs less than a network round trip."""

OFFLOAD_MIN_BYTES_ENV = "REWIND_OBJECTS_MIN_BYTES"
"""Environment variable overriding :data:`OFFLOAD_MIN_BYTES` (a whole number of bytes, >= 1)."""


def offload_min_bytes() -> int:
    """The offload threshold in bytes: ``$REWIND_OBJECTS_MIN_BYTES``, else
    :data:`OFFLOAD_MIN_BYTES`.

    Raises:
        StoreError: the variable is set but is not a whole number >= 1.
    """
    import os

    raw = os.environ.get(OFFLOAD_MIN_BYTES_ENV, "").strip()
    if not raw:
        return OFFLOAD_MIN_BYTES
    if not raw.isdigit() or int(raw) < 1:
        raise StoreError(
            f"{OFFLOAD_MIN_BYTES_ENV}={raw!r} is not a whole number of bytes >= 1",
            f"unset it (default {OFFLOAD_MIN_BYTES}) or set it to e.g. 65536",
        )
    return int(raw)


def artifact_key(run_id: str, name: str) -> str:
    """The object key of a run's artifact: ``artifacts/<run_id>/<name>``."""
    return f"artifacts/{run_id}/{name}"


class ObjectStore:
    """Content-addressed objects under one URL.

    Args:
        url: ``s3://bucket/prefix``, ``file:///abs/folder`` or any fsspec URL.
        storage_options: passed to the fsspec filesystem (e.g. ``client_kwargs={"endpoint_url":
            ...}`` for s3fs).
    Raises:
        StoreError: the URL's protocol is unknown or its fsspec package is not installed.
    """

    def __init__(self, url: str, **storage_options: Any) -> None:
        import fsspec

        self.url = url.rstrip("/")
        try:
            self.fs, path = fsspec.core.url_to_fs(self.url, **storage_options)
        except (ImportError, ValueError) as exc:
            raise StoreError(
                f"cannot use the object store URL {url!r}: {exc}",
                "use file:///folder, or s3://bucket/prefix with s3fs installed (pip install s3fs)",
            ) from exc
        self._base = path.rstrip("/")

    def blob_ref(self, digest: str) -> str:
        """The URL a blob with this sha256 is stored at."""
        return f"{self.url}/blobs/{digest[:2]}/{digest}"

    def put_blob(self, digest: str, data: bytes) -> str:
        """Write a blob's bytes (``digest`` must be their sha256); returns its reference URL.

        Raises:
            StoreError: the object store refused the write (credentials, bucket, network).
        """
        path = self._path(self.blob_ref(digest))
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data)
        except OSError as exc:
            raise StoreError(
                f"cannot write blob {digest[:12]} to {self.url}: {exc}",
                "check the object store URL, its credentials and that the bucket exists",
            ) from exc
        return self.blob_ref(digest)

    def get_blob(self, ref: str, digest: str) -> bytes:
        """The bytes at ``ref``, verified to hash to ``digest``.

        Raises:
            StoreError: the object is missing, unreadable, or its bytes do not match the hash.
        """
        try:
            data = bytes(self.fs.cat_file(self._path(ref)))
        except (OSError, FileNotFoundError) as exc:
            raise StoreError(
                f"blob {digest[:12]} cannot be read from {ref}: {exc}",
                "the object store is unreachable or the object was deleted",
            ) from exc
        if sha256_hex(data) != digest:
            raise StoreError(
                f"blob {digest[:12]} at {ref} does not match its hash",
                "the object was changed outside Rewind; restore it from a backup",
            )
        return data

    def put_object(self, key: str, data: bytes) -> str:
        """Write bytes at ``<url>/<key>`` (a relative key such as ``archive/runs/x.json.gz``);
        returns the object's URL.

        Raises:
            StoreError: the object store refused the write.
        """
        ref = f"{self.url}/{key.lstrip('/')}"
        path = self._path(ref)
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, data)
        except OSError as exc:
            raise StoreError(
                f"cannot write {key} to {self.url}: {exc}",
                "check the object store URL, its credentials and that the bucket exists",
            ) from exc
        return ref

    def get_object(self, ref: str, digest: str) -> bytes:
        """The bytes at ``ref`` (any object of this store), verified to hash to ``digest``.

        Raises:
            StoreError: the object is missing, unreadable, or its bytes do not match the hash.
        """
        return self.get_blob(ref, digest)

    def has_blob(self, digest: str) -> bool:
        """True when the object for this sha256 exists (its bytes are not read)."""
        try:
            return bool(self.fs.exists(self._path(self.blob_ref(digest))))
        except OSError:
            return False

    def delete(self, ref: str) -> None:
        """Delete the object at ``ref`` (absent objects are fine)."""
        try:
            self.fs.rm_file(self._path(ref))
        except FileNotFoundError:
            return

    def _path(self, ref: str) -> str:
        if not ref.startswith(self.url + "/"):
            raise StoreError(
                f"object {ref} is outside this store's object storage {self.url}",
                "open the store with the object store URL it was written with",
            )
        return self._base + ref[len(self.url) :]
