"""Rewind's HTTP API and browser UI: one process serves both.

``create_app`` builds the FastAPI application; ``serve`` runs it with uvicorn (``rewind serve``);
``verify_server`` runs the 14 demo checks through the HTTP API (``rewind verify --server``).
"""

from rewind.api.app import create_app
from rewind.api.command import serve, verify_server

__all__ = ["create_app", "serve", "verify_server"]
