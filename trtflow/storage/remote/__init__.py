"""Remote cache: node results shared between stores through a directory or S3-compatible object storage.

``cache.py`` is the cache (format, lookup, verified pull, put-if-absent push); ``backend.py`` the one interface
of the places it lives, ``directory.py`` and ``s3.py`` its two implementations; ``errors.py`` what can go wrong.
What a manifest must hold before anything acts on it is ``trtflow.storage.manifest``.
"""

from trtflow.storage.remote.cache import (
    DEFAULT_PART_SIZE,
    FORMAT_FILE,
    HASH_NAME,
    HASHES,
    MAX_MANIFEST_BYTES,
    REMOTE_FORMAT,
    RemoteCache,
    Transfer,
)
from trtflow.storage.remote.errors import RemoteCorrupt, RemoteError

__all__ = ["DEFAULT_PART_SIZE", "FORMAT_FILE", "HASHES", "HASH_NAME", "MAX_MANIFEST_BYTES", "REMOTE_FORMAT",
           "RemoteCache", "RemoteCorrupt", "RemoteError", "Transfer"]
