"""Where the processes of one host meet: a private per-user directory, on shared memory by default.

``uvicorn --workers 4`` and gunicorn give no hook that runs once before the workers start,
and an operator should not have to name a directory for four workers to charge a card
once. So the first process of a user creates the directory (mode 0700) and later ones join
it: ``/dev/shm/giul-asgi-<uid>`` (RAM, gone at reboot), else ``$XDG_RUNTIME_DIR/giul-asgi``,
else ``<tmp>/giul-asgi-<uid>``. One setting moves or disables it: ``Node(workers_dir=...)``
or ``$GIUL_ASGI_LOAD_DIR`` (a path; ``"off"`` or ``False`` to share nothing).

The place is private, because whoever can write in it can feed us rows (a stranger's
requests and joules merged into ours) and plant links that make us write elsewhere:

- The place is a real directory (not a symbolic link) of this user's, mode 0700, and every
  directory above it is root's or ours and writable by no one else unless sticky (``/tmp``,
  ``/dev/shm``): otherwise someone could move it away and put another in its stead.
- A *default* place is ours by its name: we create it 0700, and one found open to others
  (ours, but chmod-ed by hand) is made 0700 again, said in a warning. A default another user
  owns, a link or a file is refused and the next default is tried.
- An *explicit* place (the setting) is the operator's: created 0700 if it is missing, but
  an existing one is never chmod-ed behind their back. One that others may write or read, or
  that another user owns, is refused, and the log line says exactly what to do (``chmod 700
  DIR``, or for a shared directory such as ``/tmp``: ``mkdir -m 700 /tmp/giul-asgi``).
- Every folder in the place is made by :func:`make_dir` (a real directory of ours, never a
  link) and every file opened by :func:`open_file` (``O_NOFOLLOW``, a regular file of ours
  with no other link): a planted link or a stranger's file is refused, never followed.

Where no place works, figures are per process (``Place(None, reason, remedy=...)``) and
:func:`log_unshared` says why, once, as a warning with the remedy.

Rows, seats and folders in the place are named by process ids and judged alive in the
reader's own PID namespace. Two containers over one ``/dev/shm`` (one pod's, or
``--ipc=host``) each have their own: there each side took the other's live rows for dead
and removed them. So a process outside the host's first PID namespace shares through a
folder of its namespace's inside the place (``pidns-<inode>``): the processes of one
container meet there, and two containers never touch each other's files.

No process can tell from ids whether another namespace's processes still run, so each
process of a namespace holds its folder's *lease* (a shared ``flock`` on ``pidns-<inode>/.lease``,
which the kernel lets go when the process ends, however it ends) and stamps it (its mtime)
every :data:`STAMP_EVERY_S`. A process that finds a namespace's lease free and its stamp older
than :data:`GRACE_S` (every process of that container gone for that long: a restart) removes
its folder (:func:`sweep_namespaces`), so restarted containers no longer fill the place. The
grace is for a container whose only worker is being replaced (gunicorn's ``--max-requests``):
its master never loads this package, so between the old worker's end and the new one's
start nobody holds the lease (a hostile trial's neighbour, recycling its own workers, removed
a live container's folder there, and with it every count and record of its server).
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import fcntl
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

log = logging.getLogger("giul_asgi.hostshare")

#: The one setting: a directory, or ``off``.
ENV = "GIUL_ASGI_LOAD_DIR"
OFF = "off"
#: What turns sharing off, written any case: the environment's usual spellings of no.
OFF_WORDS = frozenset({OFF, "false", "no", "0", "none"})
#: What a place may let others do: nothing (group and other bits all clear).
PRIVATE = 0o700
#: The inode of the host's first PID namespace (the kernel's PROC_PID_INIT_INO).
INIT_PID_NAMESPACE = 0xEFFFFFFC
#: A PID namespace's folder, and the lease its live processes hold in it.
NAMESPACE_PREFIX = "pidns-"
LEASE = ".lease"
#: A namespace folder half removed (its sweeper killed) this young is left alone: it may be
#: being removed now.
YOUNG_S = 60.0
#: How often a process stamps the leases it holds, and how long a free lease's stamp must be
#: old before its namespace is taken for gone (longer than a worker's replacement takes).
STAMP_EVERY_S = 5.0
GRACE_S = 30.0

Setting = str | os.PathLike[str] | bool | None


@dataclass(frozen=True, slots=True)
class Place:
    """Where this host's processes share their tables, or why they cannot."""

    path: Path | None
    #: Why nothing is shared (``None`` when ``path`` is set).
    reason: str | None = None
    #: The operator turned sharing off (said at info level, not as a warning).
    off: bool = False
    #: What the operator can do to share again (``None`` when shared or off).
    remedy: str | None = None

    @property
    def shared(self) -> bool:
        return self.path is not None


@dataclass(frozen=True, slots=True)
class _Refused:
    why: str
    remedy: str


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
    if setting is False or (isinstance(setting, str) and setting.strip().lower() in OFF_WORDS):
        return Place(None, f"sharing is off ({ENV}=off or workers_dir=False)", off=True)
    if setting is True:
        setting = None
    if setting is not None:
        path = Path(os.fspath(setting))
        if not path.is_absolute():  # a near-miss of off (offf) made ./offf in the cwd, silently
            return Place(None, f"cannot use {str(setting)!r} ({ENV} or workers_dir): not an absolute path",
                         remedy=f"give an absolute directory (mkdir -m 700 /run/giul-asgi), or {OFF!r} "
                                "to share nothing")
        refused = _usable(path, explicit=True)
        if refused is None:
            return _in_namespace(path)
        return Place(None, f"cannot use {path}: {refused.why}", remedy=refused.remedy)
    reasons: list[str] = []
    remedies: list[str] = []
    for path in candidates if candidates is not None else default_candidates():
        refused = _usable(path, explicit=False)
        if refused is None:
            if reasons:
                _warn_once(f"the default place {reasons[0]} is refused; sharing through {path} "
                           f"instead (-> {remedies[0]})")
            return _in_namespace(path)
        reasons.append(f"{path}: {refused.why}")
        remedies.append(refused.remedy)
    return Place(None, "no place to share: " + "; ".join(reasons),
                 remedy=(remedies[0] + f"; or set {ENV} to a private directory (mkdir -m 700 DIR)")
                 if remedies else f"set {ENV} to a private directory (mkdir -m 700 DIR)")


def room(path: Path) -> int | None:
    """The size of the file system the place is on (bytes; None where it cannot be told):
    what each process's rings and tails are sized by, so that a small one (Docker's
    /dev/shm is 64 MB) holds the workers of a large server, not the first dozen."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_blocks * info.f_frsize or None


def pid_namespace() -> int | None:
    """The inode of this process's PID namespace (None where ``/proc`` does not say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _in_namespace(path: Path) -> Place:
    """The place itself for the host's first PID namespace, else its namespace's folder in it,
    leased for this process's life (see the module's docstring). Either way the folders of
    namespaces that are gone are removed, once a process."""
    ns = pid_namespace()
    if ns is None or ns == INIT_PID_NAMESPACE:
        _sweep_once(path, None)
        return Place(path)
    folder = path / f"{NAMESPACE_PREFIX}{ns}"
    try:
        _lease(folder, path)
    except OSError as exc:
        return Place(None, f"cannot use {folder}: {exc.strerror or exc}", remedy=remedy(exc))
    _sweep_once(path, folder)
    return Place(folder)


#: A namespace folder -> the descriptor holding its lease, and that file's (device, inode).
_leases: dict[Path, tuple[int, tuple[int, int]]] = {}
_swept: set[tuple[int, Path]] = set()  # (pid, place): swept once a process
_lease_lock = threading.Lock()


def _lease(folder: Path, root: Path) -> None:
    """Make ``folder`` and hold its lease (a shared ``flock``) until this process ends. A forked
    child shares the parent's descriptor, and so the lease. Raises OSError."""
    with _lease_lock:
        if folder in _leases:
            return
        for _ in range(3):
            make_dir(folder, root=root)
            try:
                fd = open_file(folder / LEASE, os.O_RDWR | os.O_CREAT)
            except FileNotFoundError:
                continue  # removed between the two steps by a sweeper that found it free
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits out a sweeper removing it now
            try:
                ours = os.stat(folder / LEASE, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except OSError:
                ours = False
            if ours:
                os.utime(fd)
                _leases[folder] = (fd, _identity(os.fstat(fd)))
                _stamping()
                return
            os.close(fd)  # the folder was swept under us: made anew
        raise OSError(errno.EAGAIN, "removed as fast as it is made, refused", os.fspath(folder))


_stamper: list[int] = []  # the pid whose thread stamps the leases (a forked child starts its own)


def _stamping() -> None:
    """Start this process's thread that stamps its leases (under ``_lease_lock``)."""
    if _stamper and _stamper[0] == os.getpid():
        return
    _stamper[:] = [os.getpid()]
    threading.Thread(target=_stamp, name="giul-lease", daemon=True).start()


def _stamp() -> None:
    while True:
        time.sleep(STAMP_EVERY_S)
        with _lease_lock:
            leases = list(_leases.values())
        for fd, lease in leases:
            with contextlib.suppress(OSError):
                # only the lease: a descriptor the app closed and reused is another file
                if _identity(os.fstat(fd)) == lease:
                    os.utime(fd)


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _sweep_once(root: Path, mine: Path | None) -> None:
    key = (os.getpid(), root)
    with _lease_lock:
        if key in _swept:
            return
        _swept.add(key)
    sweep_namespaces(root, mine)


def sweep_namespaces(root: Path, mine: Path | None = None) -> int:
    """Remove the folders of PID namespaces none of whose processes holds the lease any more
    (a container restarted: its processes all ended), and halves of such removals that a
    killed sweeper left; returns how many folders went. Never raises."""
    removed = 0
    for entry, info in own_entries(root):
        folder = Path(entry.path)
        if not stat.S_ISDIR(info.st_mode) or folder == mine:
            continue
        if entry.name.startswith(".gone-"):
            if time.time() - info.st_mtime >= YOUNG_S:  # a sweeper killed while removing it
                removed += _remove_tree(folder)
            continue
        if not entry.name.startswith(NAMESPACE_PREFIX):
            continue
        with _unleased(folder) as free:
            if not free:
                continue
            gone = root / f".gone-{entry.name}-{secrets.token_hex(4)}"
            try:
                os.rename(folder, gone)  # under the lease: whoever joins from now makes a new one
            except OSError:
                continue
        removed += _remove_tree(gone)
    return removed


def own_entries(folder: Path) -> list[tuple[os.DirEntry[str], os.stat_result]]:
    """The entries of ``folder`` this user owns, each with its own status (a link's, never its
    target's); none where ``folder`` cannot be read. What every sweep of the place starts
    from: nothing of another user's is ever ours to remove."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    uid = os.getuid()
    found = []
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # removed since it was listed
        if info.st_uid == uid:
            found.append((entry, info))
    return found


@contextlib.contextmanager
def _unleased(folder: Path) -> Iterator[bool]:
    """True for a ``with`` block if no process holds ``folder``'s lease and none has stamped it
    for :data:`GRACE_S` (the lease is then held here exclusively: nobody joins meanwhile). A
    folder with no lease is left alone: one being made this instant, or a former version's,
    whose processes may still run."""
    with held_if_free(folder / LEASE, create=False) as free:
        if free:
            try:  # else one may be starting now (its master never holds it)
                free = time.time() - os.stat(folder / LEASE, follow_symlinks=False).st_mtime >= GRACE_S
            except OSError:
                free = False
        yield free


def _remove_tree(folder: Path) -> int:
    """Remove a folder of ours and all in it, never following a link; 1 if it went."""
    try:
        shutil.rmtree(folder)
    except OSError:
        return 0
    return 1


def check_environment(env: Mapping[str, str] = os.environ) -> None:
    """A ``GIUL_ASGI_LOAD_DIR`` that is neither a word for off nor an absolute directory is a
    bad setting: it stops the middleware's startup (elsewhere :func:`resolve` shares nothing
    and says why), with the spelling of off it nearly is."""
    value = env.get(ENV)
    if not value or value.strip().lower() in OFF_WORDS or Path(value).is_absolute():
        return
    close = difflib.get_close_matches(value.strip().lower(), sorted(OFF_WORDS), n=1, cutoff=0.6)
    meant = f"did you mean {ENV}={close[0]}? " if close else ""
    raise ConfigError(f"{ENV}={value!r} is neither off nor an absolute directory",
                      remedy=f"{meant}give an absolute directory (mkdir -m 700 /run/giul-asgi), or {OFF!r} "
                             "to share nothing")


def check_setting(setting: object) -> None:
    """Fail loudly, at build time, on a setting of the wrong type."""
    if setting is None or isinstance(setting, bool | str | os.PathLike):
        if isinstance(setting, str) and not setting.strip():
            raise ConfigError("workers_dir must not be empty",
                              remedy=f"give a directory, or {OFF!r} to share nothing")
        named = isinstance(setting, str | os.PathLike) and str(setting).strip().lower() not in OFF_WORDS
        if named and not Path(os.fspath(setting)).is_absolute():  # type: ignore[arg-type]
            raise ConfigError(f"workers_dir={setting!r} is not an absolute path",
                              remedy=f"give an absolute directory (mkdir -m 700 /run/giul-asgi), or {OFF!r}")
        return
    raise ConfigError(f"workers_dir must be a directory or {OFF!r}, got {setting!r}",
                      remedy=f"give a directory every worker can write, or {OFF!r}")


# -- the checks -------------------------------------------------------------------------------

def _usable(path: Path, *, explicit: bool) -> _Refused | None:
    """Create ``path`` (0700) if missing; ``None`` if this user may share through it, else why not."""
    above = _above(path)
    if above is not None:
        return above
    try:
        created = _mkdir(path, parents=explicit)
    except OSError as exc:
        return _Refused(f"cannot create it ({exc.strerror or exc})",
                        f"create it as the user the server runs as: mkdir -m 700 {path}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return _refused_open(path, exc)
    try:
        info = os.fstat(fd)
        if created and stat.S_IMODE(info.st_mode) != PRIVATE:
            os.fchmod(fd, PRIVATE)  # made here: the umask may have taken bits we need
            info = os.fstat(fd)
        refused = _mode(path, info)
        if refused is not None:
            if explicit or created or info.st_uid != os.getuid():
                return refused
            os.fchmod(fd, PRIVATE)  # our default, opened by hand: ours again
            _warn_once(f"the place {path} was open to others (mode {stat.S_IMODE(info.st_mode):04o}): "
                       "made private again (0700); files in it that are not this user's are never read")
    except OSError as exc:
        return _Refused(f"cannot make it private ({exc.strerror or exc})", f"chmod 700 {path}")
    finally:
        os.close(fd)
    if not os.access(path, os.W_OK | os.X_OK):
        if _read_only(path):  # chmod cannot help there (a hostile trial's remedy did)
            return _Refused("it is on a read-only file system",
                            f"mount it read-write, or give a private directory on a writable one "
                            f"(mkdir -m 700 DIR; {ENV}=DIR)")
        return _Refused("this user cannot write in it", f"chmod 700 {path} (as its owner)")
    return None


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _mkdir(path: Path, *, parents: bool) -> bool:
    """Create ``path`` (mode 0700 less the umask: made exact once opened); whether it was
    created here."""
    if parents and not os.path.lexists(path.parent):
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE)
    except FileExistsError:
        return False
    return True


def _refused_open(path: Path, exc: OSError) -> _Refused:
    if os.path.islink(path):
        return _Refused(f"it is a symbolic link (to {os.readlink(path)})",
                        "name a real directory of this user's, mode 0700, not a link to one")
    if exc.errno == errno.ENOTDIR:
        return _Refused("it is not a directory", f"remove it, or name a directory: mkdir -m 700 {path}")
    return _Refused(f"cannot look at it ({exc.strerror or exc})",
                    f"check that the server's user may enter {path}")


def _mode(path: Path, info: os.stat_result) -> _Refused | None:
    """Why a directory found at ``path`` is not private (``None``: it is)."""
    uid = os.getuid()
    mode = stat.S_IMODE(info.st_mode)
    sub = path / "giul-asgi"
    if _shared_dir(info):
        return _Refused(f"it is a directory every user may write in (mode {mode:04o})",
                        f"create a private subdirectory: mkdir -m 700 {sub} and set {ENV}={sub} "
                        "(or workers_dir)")
    if info.st_uid != uid:
        return _Refused(f"it belongs to another user (uid {info.st_uid}; this server runs as uid {uid})",
                        f"give a directory of uid {uid}'s, mode 0700 (mkdir -m 700 DIR), or unset "
                        f"{ENV}: the default place is private")
    # A directory of its own first: chmod of one that other software uses (GIUL_ASGI_LOAD_DIR=/etc,
    # as root, in a stranger's trial) would break the host.
    own = f"give it a directory of its own (mkdir -m 700 {sub}; {ENV}={sub}), or chmod 700 {path} " \
          "if nothing else uses it"
    if mode & 0o022:
        return _Refused(f"others may write in it (mode {mode:04o})", own)
    if mode & 0o077:
        return _Refused(f"others may read it (mode {mode:04o})", own)
    return None


def _shared_dir(info: os.stat_result) -> bool:
    """A directory made for every user to write in (sticky, as ``/tmp`` and ``/dev/shm``)."""
    return bool(info.st_mode & stat.S_ISVTX and info.st_mode & 0o022)


def _above(path: Path) -> _Refused | None:
    """Whether every directory above ``path`` keeps it where it is: root's or ours, and
    writable by nobody else unless sticky (where others cannot rename what is ours)."""
    here = path.parent
    while not os.path.lexists(here) and here != here.parent:
        here = here.parent
    real = Path(os.path.realpath(here))
    uid = os.getuid()
    for folder in (real, *real.parents):
        try:
            info = os.stat(folder)
        except OSError as exc:
            return _Refused(f"cannot look at {folder} above it ({exc.strerror or exc})",
                            f"check that the server's user may enter {folder}")
        if info.st_uid not in (0, uid):
            return _Refused(f"{folder}, above it, belongs to another user (uid {info.st_uid}), who "
                            "could put another directory in its place",
                            "choose a place whose every parent is root's or this user's (unset "
                            f"{ENV}: the default place is private)")
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return _Refused(f"{folder}, above it, is writable by others (mode "
                            f"{stat.S_IMODE(info.st_mode):04o}) without the sticky bit: they could put "
                            "another directory in its place",
                            f"chmod go-w {folder}, or choose a place whose parents only root or this "
                            "user may write")
    return None


# -- folders and files of the place -----------------------------------------------------------

def make_dir(path: Path, *, root: Path | None = None) -> Path:
    """A folder of the place: created 0700 if missing, else accepted only if it is a real
    directory (not a link) this user owns. One found open to others is made 0700 again where
    its parent is a private folder of ours (nobody else could reach it: it is ours by its
    name), refused elsewhere. With ``root`` (the place) every folder between ``root`` and
    ``path`` is checked and made the same way; without, ``path``'s parent must be a real
    directory of ours too, and missing ancestors are made. Raises OSError (``EPERM`` for
    another user's, ``ENOTDIR`` for a link)."""
    if root is not None:
        here = root
        for part in path.relative_to(root).parts:
            here = here / part
            _folder(here)
        return path
    missing: list[Path] = []
    here = path.parent
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    if not missing and path.parent != path:
        _folder(path.parent, fix=False)
    for level in reversed(missing):
        _folder(level)
    _folder(path)
    return path


def _folder(path: Path, *, fix: bool = True) -> None:
    created = False
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, PRIVATE)
        created = True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            what = "a symbolic link" if os.path.islink(path) else "not a directory"
            raise NotADirectoryError(errno.ENOTDIR, f"{what}, refused", os.fspath(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, f"belongs to another user (uid {info.st_uid}), refused",
                                  os.fspath(path))
        mode = stat.S_IMODE(info.st_mode)
        if mode != PRIVATE and (fix or created):
            if not created and not _private(path.parent):
                raise PermissionError(errno.EPERM, f"open to others (mode {mode:04o}) outside a private "
                                      f"folder, refused: chmod 700 {path}", os.fspath(path))
            os.fchmod(fd, PRIVATE)  # made here (the umask took bits), or ours by its name
    finally:
        os.close(fd)


def _private(folder: Path) -> bool:
    try:
        info = os.stat(folder)
    except OSError:
        return False
    return info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == PRIVATE


def remedy(exc: BaseException | None) -> str:
    """What to do when the place cannot be written: a link or a file we did not make is
    someone else's doing in it (to remove, or a private place elsewhere); anything else is
    room (a full tmpfs: Docker's /dev/shm is 64 MB)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EPERM):
        where = exc.filename if exc.filename is not None else "it"
        return (f"remove {where} (a link or a file this user did not make in the place), or set "
                f"{ENV} to a private directory (mkdir -m 700 DIR)")
    return (f"free space in the place (Docker: --shm-size), or set {ENV} to a writable private "
            f"directory with room (mkdir -m 700 DIR)")


def open_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open a file in the place: never through a symbolic link (``O_NOFOLLOW``), close-on-exec,
    and only a regular file this user owns with no other hard link (a FIFO does not block the
    open: it is refused). ``O_TRUNC`` truncates only once the file is known to be ours. Raises
    OSError: ``EPERM`` for a file that is not ours, ``ELOOP`` for a link. A planted link or
    file can make us neither write elsewhere nor read its rows."""
    truncate = bool(flags & os.O_TRUNC)
    blocking = not flags & os.O_NONBLOCK
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, refused", os.fspath(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PermissionError(errno.EPERM, "not a regular file, refused", os.fspath(path))
        if info.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, f"belongs to another user (uid {info.st_uid}), refused",
                                  os.fspath(path))
        if info.st_nlink > 1:
            raise PermissionError(errno.EPERM, "has another hard link, refused", os.fspath(path))
        if blocking:
            os.set_blocking(fd, True)
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- saying it ----------------------------------------------------------------------------------

_logged: set[str] = set()
_logged_lock = threading.Lock()


def _first_time(text: str) -> bool:
    with _logged_lock:
        if text in _logged:
            return False
        _logged.add(text)
        return True


def _warn_once(text: str) -> None:
    if _first_time(text):
        log.warning("%s", text)


def log_unshared(place: Place) -> None:
    """Say once per process (per reason) that figures are this process's alone, and what to do."""
    if place.shared or place.reason is None or not _first_time(place.reason):
        return
    if place.off:
        log.info("figures are per process: %s", place.reason)
        return
    log.warning(
        "figures are per process: %s -> %s. Until then several worker processes on one card "
        "each charge it whole and each answer /energy for itself",
        place.reason, place.remedy or f"set {ENV} (or workers_dir) to a private directory "
                                      "(mkdir -m 700 DIR) every worker can write",
    )


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold the lock file ``path`` of the place (``flock``, made if missing) for a ``with``
    block, waiting for whoever holds it; raises OSError where it cannot be opened."""
    fd = open_file(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the kernel lets go of the lock with its last descriptor


@contextlib.contextmanager
def held_if_free(path: Path, *, create: bool = True) -> Iterator[bool]:
    """Hold the lock file ``path`` for a ``with`` block if nobody does: True once held; False,
    at once, where another process holds it or it cannot be opened (the chore is left to
    whoever holds it, or to the next look). ``create=False``: a missing file is not held."""
    try:
        fd = open_file(path, os.O_RDWR | (os.O_CREAT if create else 0))
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


__all__ = ["ENV", "LEASE", "OFF", "OFF_WORDS", "PRIVATE", "Place", "Setting", "check_environment",
           "check_setting", "default_candidates", "held", "held_if_free", "log_unshared", "make_dir",
           "open_file", "own_entries", "remedy", "resolve", "sweep_namespaces"]
