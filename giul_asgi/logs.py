"""Our log lines where operators look, with nothing configured.

Under a plain ``uvicorn app:app`` (gunicorn, hypercorn) nobody configures Python's logging:
the server sets up its own loggers only, so our INFO lines (each node's one startup line)
were dropped and our warnings came out bare through Python's last resort, without time or
level. :func:`show` (the middleware calls it once) fixes that and changes nothing where the
app configured logging:

- our logger (``giul_asgi``) gets INFO as its level only when it has none and the root
  logger has no handler (nobody chose);
- one handler on it, which at each record looks again: when any other handler would print
  the record (the app's ``basicConfig``, a ``dictConfig``, pytest's capture), it prints
  nothing; otherwise it hands the record, prefixed ``giul-asgi:``, to the server's own
  error logger (``uvicorn.error``, ``gunicorn.error``, ``hypercorn.error``: the first that
  prints), so it reads as the server's lines do, in its format and under its level
  (``--log-level warning`` hides our INFO too); with no server logger, to stderr as
  ``[time] [pid] [LEVEL] giul-asgi: ...``.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER = "giul_asgi"
#: The servers' error loggers, in the order tried (uvicorn's workers under gunicorn log
#: through both; the first is enough).
SERVER_LOGGERS = ("uvicorn.error", "gunicorn.error", "hypercorn.error")
PREFIX = "giul-asgi: "


class ServerHandler(logging.Handler):
    """Prints a record of ours only where nothing else would, the server's way."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self._fallback = logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s",
                                           "%Y-%m-%d %H:%M:%S %z")
        self._fallback.converter = time.localtime

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if _printed_elsewhere(record.name, self):
                return
            ours = logging.makeLogRecord(record.__dict__)
            text = record.getMessage()
            ours.msg, ours.args = text if text.startswith(PREFIX) else PREFIX + text, None
            ours.exc_info, ours.exc_text = record.exc_info, record.exc_text
            server = _server_logger()
            if server is not None:
                if record.levelno >= server.getEffectiveLevel():
                    server.handle(ours)
                return
            sys.stderr.write(self._fallback.format(ours) + "\n")
        except Exception:
            self.handleError(record)


def show() -> None:
    """Make our lines visible with nothing configured (once per process; idempotent)."""
    logger = logging.getLogger(LOGGER)
    if any(isinstance(h, ServerHandler) for h in logger.handlers):
        return
    if logger.level == logging.NOTSET and not logging.getLogger().handlers:
        logger.setLevel(logging.INFO)
    logger.addHandler(ServerHandler())


def _printed_elsewhere(name: str, ours: logging.Handler) -> bool:
    """Whether a handler other than ``ours`` sits on the record's way to the root."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None:
        if any(h is not ours for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def _server_logger() -> logging.Logger | None:
    for name in SERVER_LOGGERS:
        logger = logging.Logger.manager.loggerDict.get(name)
        if isinstance(logger, logging.Logger) and not logger.disabled and logger.hasHandlers():
            return logger
    return None


__all__ = ["LOGGER", "SERVER_LOGGERS", "ServerHandler", "show"]
