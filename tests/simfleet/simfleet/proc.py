"""Process, mount, port and lock helpers for the fleet lifecycle (host side, Linux only).

Everything here acts on process ids and paths the fleet recorded itself; nothing looks processes up
by name. Liveness and identity come from ``/proc/<pid>/stat`` and ``/proc/<pid>/cmdline``; mounts
from ``/proc/self/mountinfo`` (proc(5)).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import subprocess
import time
from typing import Iterable, Iterator, Sequence


class SimfleetError(RuntimeError):
    """A fleet operation could not be done; the message says what was wanted, found and to do."""


# ---------------------------------------------------------------------------------------------
# processes


def pid_alive(pid: int | None) -> bool:
    """True when ``pid`` exists and is not a zombie (state ``Z``/``X`` in ``/proc/<pid>/stat``)."""
    if not pid or pid <= 0:
        return False
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0:1]
    return bool(state) and state[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    """argv of ``pid`` from ``/proc/<pid>/cmdline``; ``[]`` when the process is gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def read_pid(path: str, must_contain: str) -> int | None:
    """The pid recorded in ``path`` if that process is alive and its argv contains ``must_contain``.

    The argv check guards against a recycled pid: a recorded pid is only trusted while the process
    still runs the command line the fleet started (which always names the node's own paths).
    """
    try:
        with open(path, encoding="ascii") as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    if not any(must_contain in arg for arg in cmdline(pid)):
        return None
    return pid


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` from ``/proc/<pid>/task/*/children``."""
    result: list[int] = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return result
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid), encoding="ascii") as f:
                result.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return result


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (children first, breadth first)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        nxt = []
        for p in todo:
            kids = children(p)
            out.extend(kids)
            nxt.extend(kids)
        todo = nxt
    return out


def send_signal(pid: int | None, sig: int) -> bool:
    """Send ``sig`` to ``pid``; False when the process is already gone."""
    if not pid:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Poll until every pid is gone (or a zombie) or ``timeout`` seconds passed; return the survivors."""
    pending = [p for p in pids if p]
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if pid_alive(p)]
        if pending:
            time.sleep(0.1)
    return [p for p in pending if pid_alive(p)]


def spawn_detached(argv: Sequence[str], log_path: str, env: dict | None = None, cwd: str | None = None) -> int:
    """Start ``argv`` as a daemon and return its pid.

    Double fork with ``setsid``: the daemon is in its own session, is not a child of the caller (so
    it never lingers as a zombie of a long-lived caller such as a test session), reads /dev/null and
    appends stdout/stderr to ``log_path``. Raises SimfleetError when the exec fails.
    """
    environ = dict(os.environ if env is None else env)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(rfd)
            os.setsid()
            pid2 = os.fork()
            if pid2 == 0:
                try:
                    if cwd:
                        os.chdir(cwd)
                    null = os.open(os.devnull, os.O_RDONLY)
                    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    os.dup2(null, 0)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    os.set_inheritable(wfd, False)
                    os.closerange(3, 65536)
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGHUP, signal.SIG_DFL)
                    os.execvpe(argv[0], list(argv), environ)
                finally:
                    os._exit(127)
            os.write(wfd, str(pid2).encode("ascii"))
            os._exit(0)
        except BaseException:
            os._exit(127)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        data = r.read()
    os.waitpid(pid, 0)
    if not data:
        raise SimfleetError("could not start %s (fork failed)" % argv[0])
    child = int(data)
    time.sleep(0.05)
    if not pid_alive(child):
        raise SimfleetError("%s exited at once; see %s" % (" ".join(argv), log_path))
    return child


def run(argv: Sequence[str], check: bool = True, timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run a host command (argv, no shell); on failure raise SimfleetError with its stderr."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("text", True)
    proc = subprocess.run(list(argv), timeout=timeout, check=False, **kwargs)
    if check and proc.returncode != 0:
        err = (proc.stderr or "").strip() if isinstance(proc.stderr, str) else ""
        raise SimfleetError("%s failed with status %d: %s" % (" ".join(argv), proc.returncode, err[-2000:]))
    return proc


# ---------------------------------------------------------------------------------------------
# mounts


def _unescape(field: str) -> str:
    """Undo the octal escapes (``\\040`` …) of /proc/self/mountinfo fields."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1:i + 4]) == 3 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, source) of every mount in this mount namespace."""
    result = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _sep, right = line.partition(" - ")
            fields = left.split()
            rfields = right.split()
            if len(fields) < 5 or len(rfields) < 2:
                continue
            result.append((_unescape(fields[4]), rfields[0], _unescape(rfields[1])))
    return result


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path``, deepest first (the order to unmount them in)."""
    path = os.path.realpath(path).rstrip("/")
    found = {m for m, _fstype, _source in mounts() if m == path or m.startswith(path + "/")}
    return sorted(found, key=lambda m: (m.count("/"), m), reverse=True)


def is_mountpoint(path: str) -> bool:
    """True when ``path`` itself is a mount point."""
    path = os.path.realpath(path)
    return any(m == path for m, _fstype, _source in mounts())


def unmount_under(path: str, attempts: int = 20) -> None:
    """Unmount everything at or below ``path``; retry busy mounts, then detach them lazily.

    Raises SimfleetError when a mount is still there afterwards.
    """
    for attempt in range(attempts):
        left = mounts_under(path)
        if not left:
            return
        for m in left:
            lazy = attempt >= attempts - 2
            argv = ["umount", "-l", m] if lazy else ["umount", m]
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if mounts_under(path):
            time.sleep(0.2)
    left = mounts_under(path)
    if left:
        raise SimfleetError("could not unmount %s" % ", ".join(left))


# ---------------------------------------------------------------------------------------------
# ports


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port``.

    A test bind with SO_REUSEADDR (as sshd and the repository server bind): it fails on a
    listening socket but not on connections left in TIME_WAIT by a previous server.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        return True
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            return False
        raise
    finally:
        s.close()


def port_listening(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` is accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ssh_banner(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> str | None:
    """The SSH identification line served on ``host:port`` (RFC 4253 §4.2), or None."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            data = s.recv(256)
    except OSError:
        return None
    line = data.split(b"\r\n")[0].decode("ascii", "replace")
    return line if line.startswith("SSH-") else None


def listening_ports() -> set[int]:
    """Ports with a TCP socket in LISTEN state, from /proc/net/tcp and /proc/net/tcp6."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) > 3 and parts[3] == "0A":
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


def parse_port_range(text: str) -> tuple[int, int]:
    """``"22200-22999"`` → (22200, 22999); raises SimfleetError on anything else."""
    try:
        lo_s, hi_s = text.split("-", 1)
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise SimfleetError("port range %r is not FIRST-LAST (e.g. 22200-22999)" % text) from None
    if not 1024 <= lo < hi <= 65535:
        raise SimfleetError("port range %r must lie within 1024-65535, first < last" % text)
    return lo, hi


# ---------------------------------------------------------------------------------------------
# locks and files


@contextlib.contextmanager
def file_lock(path: str, what: str = "", timeout: float = 900.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the ``with`` block."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SimfleetError("timed out waiting for the lock %s %s" % (path, what)) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_file(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` anew (its directory made, a link or old file there replaced), with ``mode``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)
