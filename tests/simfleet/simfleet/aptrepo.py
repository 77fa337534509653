"""The fleet's apt repository: simulated driver packages, indexed, signed and served on loopback.

Layout follows NVIDIA's CUDA network repository for Debian 12, a flat repository
(``deb [signed-by=KEYRING] https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /``):

* packages: ``simfleet.gpu.pkgbuild.build_packages(out_dir)`` builds the .deb files, cached under
  ``<cache>/packages-<key>`` (the key hashes the GPU simulation's files);
* index: ``Packages``/``Packages.gz`` by ``apt-ftparchive packages``, ``Release`` by
  ``apt-ftparchive release`` with Origin ``NVIDIA`` and Label ``NVIDIA CUDA`` (the label NVIDIA's own
  apt pin uses), ``InRelease`` and ``Release.gpg`` signed with a key generated for the fleet;
* served by a small HTTP server (``serve``) on ``127.0.0.1:<port>``, each node under its own path
  ``/<node>/debian12/x86_64/`` so that one node can be cut off (fault ``repo_unreachable``): the
  server then resets every connection for that node's path without answering.
"""

from __future__ import annotations

import glob
import http.server
import json
import os
import shutil
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Callable

from simfleet import SIMFLEET_DIR
from simfleet.base import gpu_files_digest
from simfleet.proc import (
    SimfleetError,
    file_lock,
    port_free,
    port_listening,
    read_pid,
    run,
    send_signal,
    spawn_detached,
    wait_gone,
    write_atomic,
)

REPO_SUBDIR = "debian12/x86_64"
RELEASE_FIELDS = {
    "Origin": "NVIDIA",
    "Label": "NVIDIA CUDA",
    "Architectures": "amd64 all",
    "Description": "simulated NVIDIA CUDA repository for debian12 (simfleet test fleet)",
}
BLOCKED_FILE = "faults/repo_blocked.json"


@dataclass
class RepoKey:
    """The fleet's repository signing key: fingerprint and exported public key files."""

    fingerprint: str
    keyring_path: str  # binary OpenPGP public key, for apt's signed-by (``.gpg``)
    armored_path: str  # the same key ASCII-armored (``.asc``)


def ensure_packages(cache: str, log: Callable[[str], None] = lambda msg: print("simfleet: " + msg, file=sys.stderr)) -> str:
    """Build the simulated driver packages once per GPU-simulation version; return their directory."""
    from simfleet.gpu import pkgbuild  # pylint: disable=import-outside-toplevel

    final = os.path.join(cache, "packages-" + gpu_files_digest()[:16])
    with file_lock(os.path.join(cache, "packages.lock"), "(building driver packages)"):
        if os.path.exists(os.path.join(final, "complete")):
            return final
        tmp = "%s.tmp-%d" % (final, os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        log("building the simulated driver packages")
        started = time.monotonic()
        files = pkgbuild.build_packages(tmp)
        if not files:
            raise SimfleetError("simfleet.gpu.pkgbuild.build_packages returned no packages")
        for path in files:
            if os.path.dirname(os.path.abspath(path)) != os.path.abspath(tmp):
                shutil.copy2(path, tmp)
        with open(os.path.join(tmp, "complete"), "w", encoding="utf-8") as f:
            json.dump({"count": len(files), "seconds": round(time.monotonic() - started, 1)}, f)
        os.rename(tmp, final)
        return final


def _gpg(home: str, *args: str, **kwargs):
    return run(["gpg", "--homedir", home, "--batch", "--no-tty", "--quiet"] + list(args), **kwargs)


def stop_gpg_agent(home: str) -> None:
    """Stop the gpg-agent serving ``home`` (``gpgconf --kill``, which asks that agent by socket)."""
    if os.path.isdir(home):
        run(["gpgconf", "--homedir", home, "--kill", "all"], check=False)


def ensure_key(fleet_dir: str, fleet_name: str) -> RepoKey:
    """Generate the fleet's signing key once (ed25519, no passphrase); export the public key."""
    home = os.path.join(fleet_dir, "gpg")
    keyring = os.path.join(fleet_dir, "repo-key.gpg")
    armored = os.path.join(fleet_dir, "repo-key.asc")
    os.makedirs(home, mode=0o700, exist_ok=True)
    os.chmod(home, 0o700)
    try:
        fpr = _fingerprint(home)
        if not fpr:
            params = (
                "%%no-protection\nKey-Type: eddsa\nKey-Curve: ed25519\nKey-Usage: sign\n"
                "Name-Real: simfleet %s apt repository\nName-Email: simfleet@localhost\n"
                "Expire-Date: 0\n%%commit\n" % fleet_name
            )
            _gpg(home, "--gen-key", input=params)
            fpr = _fingerprint(home)
        if not fpr:
            raise SimfleetError("gpg did not create a key in %s" % home)
        if not os.path.exists(keyring):
            _gpg(home, "--output", keyring + ".tmp", "--yes", "--export", fpr)
            os.replace(keyring + ".tmp", keyring)
            _gpg(home, "--output", armored + ".tmp", "--yes", "--armor", "--export", fpr)
            os.replace(armored + ".tmp", armored)
    finally:
        stop_gpg_agent(home)
    return RepoKey(fpr, keyring, armored)


def _fingerprint(home: str) -> str | None:
    out = _gpg(home, "--with-colons", "--list-secret-keys", check=False).stdout or ""
    for line in out.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    return None


def build_repo(fleet_dir: str, packages_dir: str, key: RepoKey) -> str:
    """Copy the packages into ``<fleet>/repo/debian12/x86_64``, index and sign it; return that path."""
    repo = os.path.join(fleet_dir, "repo", REPO_SUBDIR)
    if os.path.isdir(repo):
        shutil.rmtree(repo)
    os.makedirs(repo)
    for deb in sorted(glob.glob(os.path.join(packages_dir, "*.deb"))):
        dest = os.path.join(repo, os.path.basename(deb))
        try:
            os.link(deb, dest)
        except OSError:
            shutil.copy2(deb, dest)
    packages = run(["apt-ftparchive", "packages", "."], cwd=repo).stdout
    write_atomic(os.path.join(repo, "Packages"), packages)
    run(["gzip", "-9", "-n", "-k", "-f", "Packages"], cwd=repo)
    opts = []
    for field, value in RELEASE_FIELDS.items():
        opts += ["-o", "APT::FTPArchive::Release::%s=%s" % (field, value)]
    release = run(["apt-ftparchive"] + opts + ["release", "."], cwd=repo).stdout
    write_atomic(os.path.join(repo, "Release"), release)
    home = os.path.join(fleet_dir, "gpg")
    sign = ["--yes", "--pinentry-mode", "loopback", "--passphrase", "", "--local-user", key.fingerprint, "--digest-algo", "SHA512"]
    try:
        _gpg(home, *sign, "--clearsign", "--output", os.path.join(repo, "InRelease"), os.path.join(repo, "Release"))
        _gpg(home, *sign, "--armor", "--detach-sign", "--output", os.path.join(repo, "Release.gpg"), os.path.join(repo, "Release"))
    finally:
        stop_gpg_agent(home)
    shutil.copy2(key.armored_path, os.path.join(fleet_dir, "repo", "repo-key.asc"))
    return repo


def package_index(fleet_dir: str) -> list[dict]:
    """The stanzas of the served ``Packages`` index as dicts (field → value)."""
    path = os.path.join(fleet_dir, "repo", REPO_SUBDIR, "Packages")
    stanzas, cur, last = [], {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                if cur:
                    stanzas.append(cur)
                cur, last = {}, None
            elif line[0].isspace() and last:
                cur[last] += "\n" + line.strip()
            else:
                last, _sep, value = line.partition(":")
                cur[last] = value.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


def repo_url(port: int, node: str) -> str:
    """The URL a node uses for the repository (its own path prefix)."""
    return "http://127.0.0.1:%d/%s/%s/" % (port, node, REPO_SUBDIR)


# ---------------------------------------------------------------------------------------------
# blocking (fault repo_unreachable)


def blocked(fleet_dir: str) -> set[str]:
    """Node names (or ``"*"`` for all) whose requests the server refuses."""
    try:
        with open(os.path.join(fleet_dir, BLOCKED_FILE), encoding="utf-8") as f:
            return set(json.load(f))
    except (OSError, ValueError):
        return set()


def set_blocked(fleet_dir: str, node: str, block: bool) -> None:
    """Add (``block``) or remove ``node`` (or ``"*"``) from the refused set."""
    names = blocked(fleet_dir)
    if block:
        names.add(node)
    else:
        names.discard(node)
    path = os.path.join(fleet_dir, BLOCKED_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, json.dumps(sorted(names)))


# ---------------------------------------------------------------------------------------------
# server


class _RepoHandler(http.server.SimpleHTTPRequestHandler):
    server_version = "simfleet-repo/1"
    fleet_dir = ""

    def _route(self) -> tuple[str | None, str]:
        """(node or None, path inside the repo root) of the request path."""
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        parts = [p for p in path.split("/") if p]
        if parts and parts[0] != REPO_SUBDIR.split("/", maxsplit=1)[0] and parts[0] != "repo-key.asc":
            return parts[0], "/" + "/".join(parts[1:])
        return None, "/" + "/".join(parts)

    def send_head(self):
        node, inner = self._route()
        refused = blocked(self.fleet_dir)
        if "*" in refused or (node and node in refused):
            # Unreachable: reset the connection without an answer.
            self.close_connection = True
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            return None
        self.path = inner
        return super().send_head()

    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        sys.stderr.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), format % args))


def serve(fleet_dir: str, port: int) -> None:
    """Serve ``<fleet>/repo`` on 127.0.0.1:``port`` until SIGTERM (the ``_serve-repo`` command)."""
    handler = type("Handler", (_RepoHandler,), {"fleet_dir": fleet_dir})
    root = os.path.join(fleet_dir, "repo")

    def factory(*args, **kwargs):
        return handler(*args, directory=root, **kwargs)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), factory)
    httpd.daemon_threads = True
    import signal  # pylint: disable=import-outside-toplevel

    def stop(_sig, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        httpd.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def server_pid(fleet_dir: str) -> int | None:
    """pid of the fleet's repository server if it runs."""
    return read_pid(os.path.join(fleet_dir, "repo-server.pid"), os.path.join(fleet_dir, ""))


def start_server(fleet_dir: str, port: int, timeout: float = 10.0) -> int:
    """Start the repository server (if not running) and wait until it accepts connections."""
    pid = server_pid(fleet_dir)
    if pid:
        return pid
    if not port_free(port):
        raise SimfleetError(
            "port %d for the apt repository is in use by another process; free it or choose another "
            "range with --ports / SIMFLEET_PORTS" % port
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = SIMFLEET_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [sys.executable, "-m", "simfleet", "_serve-repo", os.path.join(fleet_dir, ""), str(port)]
    pid = spawn_detached(argv, os.path.join(fleet_dir, "repo-server.log"), env=env, cwd="/")
    write_atomic(os.path.join(fleet_dir, "repo-server.pid"), "%d\n" % pid)
    deadline = time.monotonic() + timeout
    while not port_listening(port):
        if time.monotonic() > deadline or not server_pid(fleet_dir):
            raise SimfleetError("the apt repository server did not start; see %s" % os.path.join(fleet_dir, "repo-server.log"))
        time.sleep(0.05)
    return pid


def stop_server(fleet_dir: str, timeout: float = 10.0) -> None:
    """Stop the repository server by its recorded pid (SIGTERM, then SIGKILL)."""
    import signal  # pylint: disable=import-outside-toplevel

    pid = server_pid(fleet_dir)
    if pid:
        send_signal(pid, signal.SIGTERM)
        if wait_gone([pid], timeout):
            send_signal(pid, signal.SIGKILL)
            wait_gone([pid], 5)
    try:
        os.unlink(os.path.join(fleet_dir, "repo-server.pid"))
    except FileNotFoundError:
        pass
