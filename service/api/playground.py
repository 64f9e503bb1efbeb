"""The browser playground: ``/`` and its static files under ``/playground/``, open without an API key
(like ``/docs``). The page itself calls only the public API, sending the key the user gives it."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

PLAYGROUND_DIR = Path(__file__).resolve().parents[1] / "playground"
ASSETS_PATH = "/playground"

# The page loads its own script and style only; no inline code, nothing from elsewhere.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(PLAYGROUND_DIR / "index.html", headers=_PAGE_HEADERS)


def install_playground(app: FastAPI) -> None:
    """Serve the page at ``/`` and its script, style and screenshot under ``/playground/``."""
    app.include_router(router)
    app.mount(ASSETS_PATH, StaticFiles(directory=PLAYGROUND_DIR), name="playground")
