"""Why a file is refused, each a ``ServiceError`` so both APIs answer it in their own shape."""

from __future__ import annotations

from service.serving.failures import ServiceError


class FileTooLarge(ServiceError, status=413, kind="file_too_large"):
    """The file, its text, or what its archive would unpack to is over a configured limit."""


class UnsupportedFile(ServiceError, status=415, kind="unsupported_file"):
    """An extension no format reads, or content that is not what its extension says."""


class InvalidFile(ServiceError, status=422, kind="invalid_file"):
    """The file is of its format but cannot be translated safely or faithfully (a path that
    leaves the archive, XML entities, malformed markup): the message says what and where."""
