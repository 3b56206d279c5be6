"""Moved to giul_asgi.serve.endpoint; this name stays until the middleware imports the new one."""

from .serve.endpoint import RECORD_SCHEMA, EnergyEndpoint

__all__ = ["RECORD_SCHEMA", "EnergyEndpoint"]
