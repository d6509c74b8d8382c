"""The dashboard: one static page that reads the store through the server's `/api/` endpoints.

`dashboard_routes()` is mounted next to the store API (`create_app(store, extra_routes=...)`):
the page at `/`, its script and style under `/dashboard/`. Everything it shows it fetches from
`/api/...` in the browser, so the server needs no templates and the page needs no build step,
no npm and no network beyond the store server itself.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC = Path(__file__).parent / "static"
"""index.html, dashboard.js, dashboard.css: shipped as package data."""

NO_CACHE = {"cache-control": "no-cache"}
"""Browsers revalidate (cheaply, by ETag) so a new agentgrad version shows its new page at once."""

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
"""Set here rather than guessed: some systems' MIME tables map `.js` to `text/plain`."""


class _Assets(StaticFiles):
    """StaticFiles with fixed content types and revalidation on every load."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(NO_CACHE)
        content_type = CONTENT_TYPES.get(Path(path).suffix)
        if content_type is not None and response.status_code == 200:
            response.headers["content-type"] = content_type
        return response


async def _index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", media_type=CONTENT_TYPES[".html"], headers=NO_CACHE)


def dashboard_routes() -> list[BaseRoute]:
    """The page at `/` and its assets under `/dashboard/`, for the store server's `extra_routes`."""
    return [
        Route("/", _index, methods=["GET", "HEAD"]),
        Mount("/dashboard", app=_Assets(directory=STATIC), name="dashboard"),
    ]
