"""Which processes are one server: the listening socket they inherited, else a process alone.

A card is shared by every process on the host that draws on it. Statistics and records are
one server's: the processes that inherited one listening socket (the workers of one uvicorn,
gunicorn or hypercorn), or a process of its own.

Why a listener: ``uvicorn --workers``, gunicorn and hypercorn all bind the socket in a master
and hand it to their workers (gunicorn by fork, uvicorn and hypercorn through
multiprocessing's spawn, which passes the descriptor itself), so every worker of one server
holds the same socket, seen as ``socket:[<inode>]`` under ``/proc/self/fd``, and no other
server does. "The same parent process" is not an identity: two single-process servers started
by one shell, supervisord or systemd (ppid 1) share a parent, and a server restarted by it
would inherit the last run. A listener counts as inherited when the parent process holds it
too (or its descriptors cannot be read, as with systemd's socket activation as root); a
single-process ``uvicorn`` binds its own socket (after the lifespan startup), and is a server
of its own, named by its pid and start time, whenever it is asked. The answer is made once
per process, at the first question, and kept: every part of one process (statistics,
records) names the same server.

Where there is no ``/proc`` the process is a server of its own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from .rows import alive, parse, process_start

#: Where a process's descriptors are listed (Linux).
FD_DIR = "/proc/self/fd"


@dataclass(frozen=True, slots=True)
class ServerId:
    """One server on this host, as its processes agree on it."""

    #: Short and safe in a file name: ``l<inode>`` (an inherited listener) or ``p<pid>-<start>``.
    key: str
    #: Why: ``inherited listener socket:[<inode>]`` or ``own process <pid>-<start>``.
    how: str
    #: The process whose life is the server's beyond its workers' (``(pid, start)``): the
    #: master that bound the listener, or this process where it is a server of its own.
    keeper: tuple[int, str | None]

    def alive(self) -> bool:
        """Whether the server's keeper still runs (its workers may come and go)."""
        return alive(*self.keeper)

    @property
    def alone(self) -> bool:
        """A process of its own: no other process is of this server, and none will be (the
        same program restarted is another server, named by its own pid and start). Its
        statistics and records are the whole server's in its memory: written in the place,
        they would be written for nobody."""
        return self.key.startswith("p")

    @property
    def folder(self) -> str:
        """The name of the server's folders in the place (statistics, records, budgets): its
        key and its keeper, so that a dead server is known by its folder's name alone (a
        restart's next start removes it at once) and a later server that happens to get the
        same key (a socket inode used again) never joins a dead one's folder."""
        pid, start = self.keeper
        return f"{self.key}.{pid}-{start or 'x'}"


def keeper_in(name: str) -> tuple[int, str | None] | None:
    """The keeper a server folder's name holds (see :attr:`ServerId.folder`); None for a
    name that holds none."""
    _, sep, tail = name.rpartition(".")
    return parse(tail + ".k", ".k") if sep else None


def listening_sockets(fd_dir: str = FD_DIR) -> dict[int, int]:
    """This process's server sockets (TCP, Unix, any family: listening, or bound and
    unconnected, see :func:`_listening`): inode -> descriptor.
    Empty where ``fd_dir`` cannot be read."""
    found: dict[int, int] = {}
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        fd = int(name)
        try:
            info = os.fstat(fd)
        except OSError:
            continue  # closed meanwhile, or the listing's own descriptor
        if not stat.S_ISSOCK(info.st_mode) or info.st_ino in found:
            continue
        if _listening(fd):
            found[info.st_ino] = fd
    return found


def _listening(fd: int) -> bool:
    """Whether the socket ``fd`` is a server's: listening (``SO_ACCEPTCONN``), or a stream
    socket bound to an address and connected to nobody (uvicorn's master binds and its
    workers listen: until the first worker has started, the socket they inherit is only
    bound). Asked of a copy of the descriptor: closing it leaves the socket as it was."""
    try:
        copy = os.dup(fd)
    except OSError:
        return False
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return False
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return True
        if sock.type != socket.SOCK_STREAM or not _bound(sock.getsockname()):
            return False
        try:
            sock.getpeername()
        except OSError as exc:
            return exc.errno == errno.ENOTCONN
        return False  # connected (a socketpair's end answers an empty name)
    except OSError:
        return False
    finally:
        sock.close()


def _bound(name: object) -> bool:
    """Whether a socket name says it is bound: a port, or a Unix path (abstract included)."""
    if isinstance(name, tuple):
        return len(name) > 1 and bool(name[1])
    return bool(name)


def _socket_inodes(pid: int) -> set[int] | None:
    """The socket inodes process ``pid`` holds; None where its descriptors cannot be read."""
    folder = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    inodes = set()
    for name in names:
        with contextlib.suppress(OSError):
            link = os.readlink(folder / name)
            if link.startswith("socket:[") and link.endswith("]"):
                inodes.add(int(link[8:-1]))
    return inodes


def identify(fd_dir: str = FD_DIR) -> ServerId:
    """This process's server, looked up now (see the module's rule)."""
    pid = os.getpid()
    start = process_start(pid)
    listeners = sorted(listening_sockets(fd_dir))
    ppid = os.getppid()
    if listeners and ppid > 1:
        held = _socket_inodes(ppid)
        shared = [i for i in listeners if held is None or i in held]
        if shared:
            # the oldest (lowest inode): the master's, before any a worker binds for itself
            inode = shared[0]
            return ServerId(f"l{inode}", f"inherited listener socket:[{inode}]",
                            (ppid, process_start(ppid)))
    elif listeners and ppid <= 1:
        # A master that is pid 1 (a container's `CMD uvicorn --workers 4`, gunicorn as init)
        # holds the listener: it is the keeper, as any master is (each worker its own keeper
        # split the records by worker). Else socket activation (systemd hands the listener
        # over, and we may not look in pid 1): the listener outlives a restart, and so does
        # the server.
        inode = listeners[0]
        held = _socket_inodes(ppid) if ppid == 1 else None
        keeper = (ppid, process_start(ppid)) if held is not None and inode in held else (pid, start)
        return ServerId(f"l{inode}", f"inherited listener socket:[{inode}] (from pid {ppid})", keeper)
    name = f"{pid}-{start}" if start is not None else f"{pid}-x{secrets.token_hex(3)}"
    return ServerId(f"p{name}", f"own process {name}", (pid, start))


_lock = threading.Lock()
_known: tuple[int, ServerId] | None = None


def server_identity() -> ServerId:
    """This process's server, found at the first question and kept (asked again in a
    forked child, which may be another server's worker)."""
    global _known
    with _lock:
        if _known is None or _known[0] != os.getpid():
            _known = (os.getpid(), identify())
        return _known[1]


__all__ = ["FD_DIR", "ServerId", "identify", "keeper_in", "listening_sockets", "server_identity"]
