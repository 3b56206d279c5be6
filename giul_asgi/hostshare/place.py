"""Where the processes of one host meet: a per-user directory on shared memory, by default.

``uvicorn --workers 4`` and gunicorn give no hook that runs once before the workers start,
and an operator should not have to name a directory for four workers to charge a card
once. So the first process of a user creates the directory (mode 0700) and later ones join
it: ``/dev/shm/giul-asgi-<uid>`` (RAM, gone at reboot), else ``$XDG_RUNTIME_DIR/giul-asgi``,
else ``<tmp>/giul-asgi-<uid>``. A directory another user owns, a symbolic link or one we
cannot write is refused (someone else could feed us rows), and the next place is tried.

One setting moves or disables it: ``Node(workers_dir=...)`` or ``$GIUL_ASGI_LOAD_DIR``
(a path; ``"off"`` or ``False`` to share nothing). Where no place works, figures are per
process and :func:`log_unshared` says so once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

log = logging.getLogger("giul_asgi.hostshare")

#: The one setting: a directory, or ``off``.
ENV = "GIUL_ASGI_LOAD_DIR"
OFF = "off"

Setting = str | os.PathLike[str] | bool | None


@dataclass(frozen=True, slots=True)
class Place:
    """Where this host's processes share their tables, or why they cannot."""

    path: Path | None
    #: Why nothing is shared (``None`` when ``path`` is set).
    reason: str | None = None
    #: The operator turned sharing off (said at info level, not as a warning).
    off: bool = False

    @property
    def shared(self) -> bool:
        return self.path is not None


def default_candidates() -> list[Path]:
    """The default places, best first."""
    uid = os.getuid()
    places = [Path("/dev/shm") / f"giul-asgi-{uid}"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        places.append(Path(runtime) / "giul-asgi")
    places.append(Path(tempfile.gettempdir()) / f"giul-asgi-{uid}")
    return places


def resolve(setting: Setting = None, *, candidates: Sequence[Path] | None = None) -> Place:
    """The place for ``setting`` (a node's ``workers_dir``), else ``$GIUL_ASGI_LOAD_DIR``,
    else the first default that works. Never raises: a place that fails is a reason."""
    if setting is None:
        setting = os.environ.get(ENV) or None
    if setting is False or (isinstance(setting, str) and setting.strip().lower() == OFF):
        return Place(None, f"sharing is off ({ENV}=off or workers_dir=False)", off=True)
    if setting is True:
        setting = None
    if setting is not None:
        path = Path(os.fspath(setting))
        problem = _usable(path, private=False)
        if problem is None:
            return Place(path)
        return Place(None, f"cannot use {path}: {problem}")
    reasons = []
    for path in candidates if candidates is not None else default_candidates():
        problem = _usable(path, private=True)
        if problem is None:
            return Place(path)
        reasons.append(f"{path}: {problem}")
    return Place(None, "no place to share: " + "; ".join(reasons))


def check_setting(setting: object) -> None:
    """Fail loudly, at build time, on a setting of the wrong type."""
    if setting is None or isinstance(setting, bool | str | os.PathLike):
        if isinstance(setting, str) and not setting.strip():
            raise ConfigError("workers_dir must not be empty",
                              remedy=f"give a directory, or {OFF!r} to share nothing")
        return
    raise ConfigError(f"workers_dir must be a directory or {OFF!r}, got {setting!r}",
                      remedy=f"give a directory every worker can write, or {OFF!r}")


def _usable(path: Path, *, private: bool) -> str | None:
    """Create ``path`` (0700) if missing; ``None`` if this user may share through it, else why not."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        try:
            path.mkdir(mode=0o700, parents=not private, exist_ok=True)
            info = os.lstat(path)
        except OSError as exc:
            return f"cannot create it ({exc.strerror or exc})"
    except OSError as exc:
        return f"cannot look at it ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if info.st_uid != os.getuid():
        return f"it belongs to another user (uid {info.st_uid})"
    if private and info.st_mode & 0o077:
        try:
            os.chmod(path, 0o700)  # ours: keep it to ourselves
        except OSError as exc:
            return f"cannot make it private ({exc.strerror or exc})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def open_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open a file in the place: never through a symbolic link (``O_NOFOLLOW``), close-on-exec,
    and only a regular file this user owns. Raises OSError (``EPERM`` for a file that is not
    ours): a planted link or file can make us neither write elsewhere nor read its rows."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, "not a regular file of this user's", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(path: Path) -> Path:
    """A folder of the place: created 0700 if missing, else accepted only if it is a real
    directory (not a link) this user owns, made private if it was not. Raises OSError."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a real directory", os.fspath(path))
    if info.st_uid != os.getuid():
        raise PermissionError(errno.EPERM, f"belongs to another user (uid {info.st_uid})", os.fspath(path))
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


_logged: set[str] = set()
_logged_lock = threading.Lock()


def log_unshared(place: Place) -> None:
    """Say once per process (per reason) that figures are this process's alone."""
    if place.shared or place.reason is None:
        return
    with _logged_lock:
        if place.reason in _logged:
            return
        _logged.add(place.reason)
    log.log(
        logging.INFO if place.off else logging.WARNING,
        "figures are per process: %s. Several worker processes on one card would each charge "
        "it whole; set %s (or workers_dir) to a directory every worker can write",
        place.reason, ENV,
    )


__all__ = ["ENV", "OFF", "Place", "Setting", "check_setting", "default_candidates", "log_unshared",
           "make_dir", "open_file", "resolve"]
