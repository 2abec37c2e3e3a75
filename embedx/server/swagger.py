"""Swagger UI's files for /docs, from the copy the swagger-ui-py package ships (no CDN: an
offline host serves them too), found without importing the package and read once."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from embedx.errors import NotFound

# The files /docs loads, by the name it asks for, with their media types
ASSETS = {
    "swagger-ui.css": b"text/css; charset=utf-8",
    "swagger-ui-bundle.js": b"text/javascript; charset=utf-8",
    "favicon-32x32.png": b"image/png",
}
PACKAGE = "swagger-ui-py"


def asset(name: str) -> tuple[bytes, bytes]:
    """One of Swagger UI's files: its media type and its bytes."""
    if name not in ASSETS:
        raise NotFound(f"/docs/{name} is not one of Swagger UI's files here")
    return ASSETS[name], _read(name)


@functools.cache
def _read(name: str) -> bytes:
    spec = importlib.util.find_spec("swagger_ui")  # its files only: its code is never run
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"/docs needs the {PACKAGE} package: pip install {PACKAGE}")
    return (Path(next(iter(spec.submodule_search_locations))) / "static" / name).read_bytes()
