"""How S3 client failures (obstore, botocore) map to tierlog's typed storage errors, and
which of them are transient, of which kind (for the retry policy's reports)."""

from __future__ import annotations

import re

from tierlog.storage.errors import (
    AlreadyExistsError,
    InvalidKeyError,
    NotFoundError,
    PermanentError,
    PreconditionFailedError,
    StorageError,
    TransientError,
)
from tierlog.storage.retry import (
    KIND_CONNECTION,
    KIND_INCOMPLETE_BODY,
    KIND_SERVER_ERROR,
    KIND_THROTTLED,
    KIND_TIMEOUT,
    kind_from_text,
)

_STATUS = re.compile(r"status(?: code)?: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_REJECTED_STATUS = frozenset({429, 503})  # throttled: the request was refused, not applied


class S3Failure(Exception):
    """A classified client failure: the typed error to raise plus the HTTP status if any."""

    def __init__(self, error: StorageError, status: int | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.status = status


def first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 300 else line[:300] + "..."


def classify(exc: BaseException, what: str) -> S3Failure:
    """Map an obstore / botocore exception to tierlog's typed errors."""
    if isinstance(exc, S3Failure):
        return exc
    if isinstance(exc, StorageError):
        return S3Failure(exc, None)
    text = str(exc)
    match = _STATUS.search(text)
    status = int(match.group(1)) if match else None
    code_match = _CODE.search(text)
    code = code_match.group(1) if code_match else None
    name = type(exc).__name__
    # botocore errors carry the status and code in the response
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", status)
        code = response.get("Error", {}).get("Code", code)
    detail = f"HTTP {status} {code}" if status else first_line(text)
    if code in ("KeyTooLongError", "InvalidObjectName"):
        return S3Failure(InvalidKeyError(f"{what}: rejected by the server ({detail})"), status)
    if code == "NoSuchBucket":
        return S3Failure(PermanentError(f"{what}: bucket does not exist ({detail})"), status)
    if (
        isinstance(exc, FileNotFoundError)
        or name == "NotFoundError"
        or code in ("NoSuchKey", "NoSuchUpload")
        or status == 404
    ):
        return S3Failure(NotFoundError(f"{what}: not found"), status or 404)
    if name == "AlreadyExistsError" or (status == 412 and "create" in what):
        return S3Failure(AlreadyExistsError(f"{what}: already exists"), status)
    if name == "PreconditionError" or status == 412:
        return S3Failure(PreconditionFailedError(f"{what}: precondition failed"), status)
    if name in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
        return S3Failure(
            PermanentError(f"{what}: access denied, check S3 credentials ({detail})"), status
        )
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return S3Failure(PermanentError(f"{what}: no S3 credentials ({text})"), None)
    if status is not None:
        if status in _RETRYABLE_STATUS:
            kind = (
                KIND_THROTTLED
                if status in _REJECTED_STATUS
                else KIND_TIMEOUT
                if status == 408
                else KIND_SERVER_ERROR
            )
            return S3Failure(TransientError(f"{what}: {detail}", kind=kind), status)
        if status >= 500 or (
            status == 409 and code in ("ConditionalRequestConflict", "OperationAborted")
        ):
            return S3Failure(TransientError(f"{what}: {detail}", kind=KIND_SERVER_ERROR), status)
        return S3Failure(PermanentError(f"{what}: {detail}"), status)
    if isinstance(exc, ValueError | TypeError) and name not in ("GenericError",):
        return S3Failure(PermanentError(f"{what}: {first_line(text)}"), None)
    # no HTTP status: connection refused / reset, DNS, timeouts, a body cut short: retry
    detail = first_line(text)
    return S3Failure(TransientError(f"{what}: {detail}", kind=transport_kind(text)), None)


_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
_HTTP_KINDS = {
    "Connect": KIND_CONNECTION,
    "Request": KIND_CONNECTION,
    "Interrupted": KIND_CONNECTION,
    "Timeout": KIND_TIMEOUT,
    "Decode": KIND_INCOMPLETE_BODY,
}


def transport_kind(text: str) -> str:
    """The kind of a failure without an HTTP status: object_store's ``HttpError`` kind from
    the error's debug text (Connect, Request, Interrupted, Timeout, Decode), else a guess
    from the first line (botocore and other clients)."""
    match = _HTTP_KIND.search(text)
    if match:
        return _HTTP_KINDS.get(match.group(1), kind_from_text(first_line(text)))
    return kind_from_text(first_line(text))


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, S3Failure) and isinstance(exc.error, TransientError)


def failure_kind(exc: BaseException) -> str:
    error = exc.error if isinstance(exc, S3Failure) else exc
    return getattr(error, "kind", "") or kind_from_text(str(error))
