"""Rewind's HTTP API and browser UI: one process serves both.

``create_app`` builds the FastAPI application; :mod:`rewind.cli.serve` runs it with uvicorn
(``rewind serve``) and runs the 14 demo checks through the HTTP API (``rewind verify --server``).
"""

from rewind.api.app import create_app

__all__ = ["create_app"]
