"""Storage faults, named independently of the database driver."""


class StorageUnavailable(Exception):
    """The database could not complete an operation (busy, I/O error, read-only).
    Nothing was applied; the caller may retry."""


class StorageRefused(Exception):
    """The database cannot be used safely (pragmas not honoured, schema newer than
    the code, failed integrity check). The service refuses to start."""
