"""How a bad setting stops the server's startup, however the middleware is added.

A :class:`~giul_asgi.errors.ConfigError` raised by the constructor is the clearest answer
where a person called it (a test, a script, a REPL): they see it at once. Two callers
misread it, and for them the error is kept and the lifespan startup fails with it instead:

- **A framework building its stack.** Starlette and FastAPI build the middleware stack
  (``build_middleware_stack``) at the first ASGI call, the lifespan's. An exception there
  reads to uvicorn (lifespan "auto") and hypercorn as "lifespan unsupported": the server
  starts, every request rebuilds the stack, raises again and is answered 500 with a
  traceback; with lifespan "on" the server stops under a traceback.
- **A server importing the app** (``app = EnergyMiddleware(app, ...)`` in the module that
  ``uvicorn app:app`` or a gunicorn worker loads): the error is printed under a traceback,
  and gunicorn logs it as a worker's crash.

Every ASGI server stops at ``lifespan.startup.failed`` and prints its message, so the kept
error becomes one line, ``giul-asgi: <what is wrong>. <the remedy>``, and a non-zero exit:
uvicorn exits 3 ("Application startup failed. Exiting."), gunicorn's arbiter halts ("Worker
failed to boot."). Hypercorn prints its own traceback for any failed startup (its last line
is ours) and, with its default one worker, exits 0 (hypercorn 0.18's ``run`` drops the
worker's exit code): that is hypercorn's, for every app whose startup fails.

Without lifespan (``--lifespan off``, a test client outside ``with``) there is no startup to
stop: the one line is logged once at ERROR and the app's requests pass untouched, unmetered,
rather than each answered 500 under a traceback (a stranger's trial found that).

Only the failing path looks at the call stack; a middleware built right pays nothing.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from ..deferred import built_for_a_server
from ..errors import ConfigError, GiulError

P = ParamSpec("P")


class KeepsConfigError(Protocol):
    """What :func:`fails_the_startup` asks of the object it builds."""

    def keep_config_error(self, error: ConfigError) -> None: ...


K = TypeVar("K", bound=KeepsConfigError)


def fails_the_startup(init: Callable[Concatenate[K, P], None]) -> Callable[Concatenate[K, P], None]:
    """Decorate ``__init__``: a ConfigError raised for a person is raised; one raised while a
    framework or a server builds the app is handed to ``keep_config_error``, which must leave
    the object able to fail the lifespan startup with it (any other error there too, as a
    ConfigError that names it)."""

    @functools.wraps(init)
    def build(self: K, /, *args: P.args, **kwargs: P.kwargs) -> None:
        try:
            init(self, *args, **kwargs)
        except Exception as error:
            if not built_for_a_server(sys._getframe(1)):
                raise
            if not isinstance(error, ConfigError):
                # A setting of a shape nothing checked (a bug, then, but a server that
                # answers every request 500 is worse than one that does not start).
                error = ConfigError(
                    f"the middleware could not be built from its settings: "
                    f"{type(error).__name__}: {error}",
                    remedy="check each setting against docs/configuration.md")
            self.keep_config_error(error)

    return build


def failure_line(error: GiulError) -> str:
    """The one line an operator reads: ``giul-asgi: <message>. <remedy>``."""
    text = f"giul-asgi: {error.message}"
    return f"{text}. {error.remedy}" if error.remedy else text


__all__ = ["KeepsConfigError", "built_for_a_server", "fails_the_startup", "failure_line"]
