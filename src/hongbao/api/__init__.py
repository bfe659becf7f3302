"""The HTTP API (Starlette). See `hongbao.api.app.create_app`."""

from hongbao.api.app import create_app

__all__ = ["create_app"]
