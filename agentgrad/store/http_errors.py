"""The store server's error answers: every exception a request can cause, as a status and a JSON body
that says what was wrong (`{"error": "NotFoundError", "detail": "no rollout with id 'ro-x'"}`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from pydantic import ValidationError
from starlette.responses import JSONResponse, Response

from agentgrad.store.errors import DiskFullError, InvalidTransitionError, NotFoundError, StoreError, StoreUnavailable
from agentgrad.store.idempotency import Answer

log = logging.getLogger("agentgrad.store.server")

JSON = "application/json"


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the server's limit of {limit} bytes; send smaller batches")


def problem(status: int, error: str, detail: str) -> Answer:
    return status, json.dumps({"error": error, "detail": detail}).encode()


def error_response(status: int, error: str, detail: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def validation_message(exc: ValidationError) -> str:
    """`spans.0.name: Field required; ...`: where each problem is and what it is."""
    parts = []
    for error in exc.errors(include_url=False)[:10]:
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)


def exception_answer(exc: BaseException) -> Answer:
    """The 4xx a store exception means; anything unexpected is a logged 500."""
    if isinstance(exc, BodyTooLarge):
        return problem(413, "BodyTooLarge", str(exc))
    if isinstance(exc, ValidationError):
        return problem(422, "ValidationError", validation_message(exc))
    if isinstance(exc, NotFoundError):
        return problem(404, "NotFoundError", str(exc))
    if isinstance(exc, InvalidTransitionError):
        return problem(409, "InvalidTransitionError", str(exc))
    if isinstance(exc, DiskFullError):  # the store logged the incident once: no traceback per write
        return problem(507, "DiskFullError", str(exc))
    if isinstance(exc, StoreUnavailable):  # the database is away or at its limit: the client retries
        log.warning("store unavailable: %s", exc)
        return problem(503, "StoreUnavailable", str(exc))
    if isinstance(exc, StoreError):
        return problem(400, "StoreError", str(exc))
    if isinstance(exc, (ValueError, OverflowError)):  # bad enum values and numbers a backend cannot hold
        return problem(422, "ValueError", str(exc))
    log.error("store server failed", exc_info=exc)
    return problem(500, "InternalError", f"{type(exc).__name__}: {exc}")


def exception_response(exc: BaseException) -> Response:
    status, body = exception_answer(exc)
    return Response(body, status_code=status, media_type=JSON)
