"""The gateway's admin route: read and swap its route table live (`GET` / `PUT /admin/routes`), and its client.

`PUT` takes `{"routes": <a routing file as JSON>, "if_id": <optional id>}` (the tables `routing.parse_routes`
reads; `agentgrad gateway routes set FILE` sends a TOML file so) and answers the new table's summary; a table
that cannot serve gets a 400 with the reason and the old one keeps serving; `if_id` naming a table that no
longer serves gets a 409. `GET` answers the summary of the table serving: its id, generation, routing file
(secrets left out) and what stays pinned. Both need the gateway's token, like every route but `/health`.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from agentgrad.gateway.relay import reject, send_json
from agentgrad.gateway.table import RouteTable, TableChanged
from agentgrad.serving.guard import MAX_BODY_BYTES, BodyTooLarge, read_body

ROUTES_PATH = "/admin/routes"
HEALTH_PATH = "/health"


def is_public(path: str) -> bool:
    """The gateway's one route without a token (`guard.Guard(public=...)`): its health check, for probes."""
    return path == HEALTH_PATH


class Swappable(Protocol):
    """What the admin route needs of a gateway (`app.Gateway`)."""

    @property
    def table(self) -> RouteTable: ...

    def route_summary(self) -> dict[str, Any]: ...

    def set_routing_file(self, table: Any, if_id: str | None = None) -> RouteTable: ...


async def serve_routes(gateway: Swappable, method: str, receive: Any, send: Any) -> None:
    """Answer `GET` or `PUT /admin/routes`."""
    if method == "GET":
        return await send_json(send, 200, orjson.dumps(gateway.route_summary()))
    if method != "PUT":
        message = f"{ROUTES_PATH} takes GET (the table serving) or PUT (a new one), not {method}"
        return await reject(send, 405, message, "method_not_allowed")
    try:
        body = await read_body(receive, MAX_BODY_BYTES)
    except BodyTooLarge as exc:
        return await reject(send, 413, str(exc), "request_too_large")
    if body is None:
        return  # the caller hung up
    try:
        posted = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return await reject(send, 400, f"the body is not JSON: {exc}", "invalid_route_table")
    if not isinstance(posted, dict) or not isinstance(posted.get("routes"), dict) or set(posted) - {"routes", "if_id"}:
        message = 'send {"routes": <the routing file as JSON>, "if_id": <optional id of the table you read>}'
        return await reject(send, 400, message, "invalid_route_table")
    if_id = posted.get("if_id")
    try:
        gateway.set_routing_file(posted["routes"], if_id=if_id if isinstance(if_id, str) else None)
    except TableChanged as exc:
        return await reject(send, 409, str(exc), "route_table_changed")
    except ValueError as exc:
        message = f"route table refused, the old one ({gateway.table.id}) keeps serving: {exc}"
        return await reject(send, 400, message, "invalid_route_table")
    await send_json(send, 200, orjson.dumps(gateway.route_summary()))


# ----------------------------------------------------------------------------- the client (CLI, algorithms)


def _base(url: str) -> str:
    """A gateway's root from its URL, with or without `/v1`."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def show_routes(url: str, token: str | None = None) -> dict[str, Any]:
    """The summary of the table a gateway serves (`GET /admin/routes`); RuntimeError with its answer if refused."""
    import httpx

    answer = httpx.get(_base(url) + ROUTES_PATH, headers=_headers(token), timeout=30)
    return _result(answer)


def set_routes(url: str, routes: dict[str, Any], token: str | None = None, if_id: str | None = None) -> dict[str, Any]:
    """Swap a gateway's table for `routes` (a parsed routing file): the new table's summary; RuntimeError with the
    gateway's reason when it refuses (the old table still serves)."""
    import httpx

    body: dict[str, Any] = {"routes": routes} | ({"if_id": if_id} if if_id is not None else {})
    answer = httpx.put(_base(url) + ROUTES_PATH, json=body, headers=_headers(token), timeout=30)
    return _result(answer)


def _headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _result(answer: Any) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        body = {"error": {"message": answer.text[:500]}}
    if answer.status_code != 200:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else str(body)
        raise RuntimeError(f"the gateway answered {answer.status_code}: {message}")
    return body
