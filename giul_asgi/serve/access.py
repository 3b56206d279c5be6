"""Who may read what giul-asgi serves: one set of rules for ``/energy`` and ``giul-agent``.

Why one module: both answer read-only GETs that reveal what a deployment does, and both take a
bearer token. Two copies of the checks had drifted apart (the agent took a one-character token
and refused ``bearer`` in lower case, which ``/energy`` accepted). The rules, once:

- a token is at least :data:`MIN_TOKEN_CHARS` characters of RFC 6750's ``b64token`` alphabet
  (what ``secrets.token_urlsafe`` makes), checked when the server is built: anything else is a
  :class:`~giul_asgi.errors.ConfigError` saying how to make one;
- the ``Authorization`` scheme is matched without regard to case (RFC 9110 section 11.1), the
  credentials compared in constant time;
- a guard is a callable ``scope -> bool``, sync or async; one that raises refuses;
- with neither a token nor a guard, a server that says so serves loopback clients only.
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

Scope = Mapping[str, Any]
Guard = Callable[[Scope], bool | Awaitable[bool]]

#: 16 characters of a 64-letter alphabet: 96 bits, out of reach of guessing over HTTP.
MIN_TOKEN_CHARS = 16
TOKEN_REMEDY = "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # RFC 6750 section 2.1


def check_token(token: object, *, name: str = "token") -> str | None:
    """``token`` if it is a usable bearer token, None if None; otherwise a ConfigError."""
    if token is None:
        return None
    if not isinstance(token, str):
        raise ConfigError(f"{name} must be a string, got {type(token).__name__}", remedy=TOKEN_REMEDY)
    if not _B64TOKEN.fullmatch(token):
        what = "blank" if not token.strip() else "not a bearer token (letters, digits, -._~+/, = at the end)"
        raise ConfigError(f"{name} is {what}", remedy=TOKEN_REMEDY)
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{name} has {len(token)} characters, fewer than {MIN_TOKEN_CHARS}",
                          remedy=TOKEN_REMEDY)
    return token


def check_guard(guard: object, *, name: str = "guard") -> Guard | None:
    """``guard`` if it is callable (or None); otherwise a ConfigError."""
    if guard is not None and not callable(guard):
        raise ConfigError(f"{name} must be a callable taking the ASGI scope, got {guard!r}",
                          remedy="pass a function scope -> bool (sync or async)")
    return guard


def bearer_credentials(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The credentials of the first ``Authorization: Bearer ...`` header, any case of ``Bearer``."""
    for key, value in headers:
        if key.lower() == b"authorization":
            scheme, _, credentials = bytes(value).strip().partition(b" ")
            credentials = credentials.strip()
            return credentials if scheme.lower() == b"bearer" and credentials else None
    return None


def token_matches(given: bytes | str | None, token: str) -> bool:
    """Whether ``given`` is ``token``, compared in constant time."""
    if given is None:
        return False
    if isinstance(given, str):
        given = given.encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, token.encode())


def is_loopback(host: str | None) -> bool:
    """Whether an address (or ``localhost``) is this machine's loopback."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_is_loopback(scope: Scope) -> bool:
    """Whether the ASGI client is on loopback (no client: no)."""
    client = scope.get("client")
    return is_loopback(client[0]) if client else False


async def guard_allows(guard: Guard, scope: Scope) -> bool:
    """The guard's verdict; a guard that raises refuses."""
    try:
        allowed = guard(scope)
        if inspect.isawaitable(allowed):
            allowed = await allowed
    except Exception:
        return False
    return bool(allowed)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused, for the server to render in its own format."""

    status: int
    error: str
    remedy: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()


class Access:
    """The rule a server applies to each request: its token, its guard, loopback when neither.

    Built once, with the server: a bad token or guard raises :class:`ConfigError` here.
    ``loopback_when_open`` is False for a server that decides at bind time instead (the agent
    refuses to bind beyond loopback without a token).
    """

    __slots__ = ("_open_remedy", "_www_authenticate", "guard", "loopback_when_open", "token")

    def __init__(self, *, token: str | None = None, guard: Guard | None = None,
                 loopback_when_open: bool = True, realm: str = "giul-asgi", token_name: str = "token",
                 guard_name: str = "guard") -> None:
        self.token = check_token(token, name=token_name)
        self.guard = check_guard(guard, name=guard_name)
        self.loopback_when_open = loopback_when_open
        self._open_remedy = (f"to serve other clients, set {token_name}= (a bearer token they send as "
                             f"Authorization: Bearer <token>) or {guard_name}= (a function scope -> bool)")
        self._www_authenticate = ((b"www-authenticate", f'Bearer realm="{realm}"'.encode()),)

    async def refusal(self, scope: Scope, query_token: str | None = None) -> Refusal | None:
        """None when ``scope`` may be served, else why not. ``query_token``: ``?token=``, if allowed."""
        if self.token is not None:
            given = bearer_credentials(scope.get("headers") or ())
            if not token_matches(given if given is not None else query_token, self.token):
                return Refusal(401, "a bearer token is required",
                               "send Authorization: Bearer <token>", self._www_authenticate)
        if self.guard is not None and not await guard_allows(self.guard, scope):
            return Refusal(403, "refused by the guard")
        if (self.loopback_when_open and self.token is None and self.guard is None
                and not client_is_loopback(scope)):
            return Refusal(403, "served to loopback clients only", self._open_remedy)
        return None


__all__ = [
    "MIN_TOKEN_CHARS", "Access", "Guard", "Refusal", "bearer_credentials", "check_guard",
    "check_token", "client_is_loopback", "guard_allows", "is_loopback", "token_matches",
]
