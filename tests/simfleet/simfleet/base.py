"""The nodes' read-only root filesystem: a cached debootstrap of Debian 12 plus a layer of node files.

Two cached directories, both under the cache directory and both used as overlay lower layers:

* ``debootstrap-<key>/rootfs``: ``debootstrap --variant=minbase`` of bookworm with
  ``BASE_PACKAGES``; the key hashes the suite, variant and package list. Slow to build (about
  1.5 minutes on 2 cores), rebuilt only when the package list changes.
* ``layer-<key>/rootfs``: an overlay upper directory made over the debootstrap base holding the
  trimming of units (``trim_rootfs``) and the GPU simulation's node-side files
  (``simfleet.gpu.nodefiles.install_into_rootfs``); the key hashes the debootstrap key, the trimming
  and every file of ``simfleet/gpu`` (plus the host's pynvml, which that layer copies). Seconds to
  build, so edits of the GPU simulation never cost a new debootstrap.

A node's root is then ``overlay(lowerdir=layer:debootstrap, upperdir=<node>/upper)``.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from typing import Callable

from simfleet import PACKAGE_DIR
from simfleet.proc import SimfleetError, file_lock, mounts_under, pid_alive, run, unmount_under, write_file

SUITE = "bookworm"
VARIANT = "minbase"
# What every node has besides minbase (the interface between the two halves lists these).
BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "apt-utils",
    "kmod",
    "binutils",
    "gnupg",
    "unattended-upgrades",
    "procps",
    "iproute2",
    "sudo",
    "ca-certificates",
)
# Bump when the way the debootstrap directory is made changes.
DEBOOTSTRAP_FORMAT = 1
# Bump when trim_rootfs changes.
TRIM_FORMAT = 3
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

# (command or file on the control host, Debian package that provides it)
HOST_REQUIREMENTS = (
    ("debootstrap", "debootstrap"),
    ("systemd-nspawn", "systemd-container"),
    ("apt-ftparchive", "apt-utils"),
    ("gpg", "gnupg"),
    ("gpgconf", "gnupg"),
    ("ssh", "openssh-client"),
    ("ssh-keygen", "openssh-client"),
    ("dpkg-deb", "dpkg"),
    ("mount", "mount"),
    ("umount", "mount"),
    (DEBIAN_KEYRING, "debian-archive-keyring"),
)

# Units that a test node does not need. Removing the "wants" links disables them the way
# `systemctl disable` would (a role may enable them again); masking is kept for the consoles,
# which have no terminal to serve in a node.
UNWANTED_LINKS = (
    "etc/systemd/system/getty.target.wants/getty@tty1.service",
    "etc/systemd/system/timers.target.wants/apt-daily.timer",
    "etc/systemd/system/timers.target.wants/apt-daily-upgrade.timer",
    "etc/systemd/system/timers.target.wants/dpkg-db-backup.timer",
    "etc/systemd/system/timers.target.wants/e2scrub_all.timer",
    "etc/systemd/system/timers.target.wants/fstrim.timer",
    "etc/systemd/system/multi-user.target.wants/e2scrub_reap.service",
    # The shutdown helper of unattended-upgrades: a 20 MB Python process per node, only needed
    # to finish an unattended upgrade at shutdown; the package and its configuration stay.
    "etc/systemd/system/multi-user.target.wants/unattended-upgrades.service",
    "etc/systemd/system/sysinit.target.wants/systemd-pstore.service",
)
MASKED_UNITS = (
    "console-getty.service",
    "container-getty@.service",
    "getty@.service",
    "serial-getty@.service",
    "getty-static.service",
    "systemd-tmpfiles-clean.timer",
)
JOURNALD_CONF = """\
# simfleet: keep each node's journal small and in memory.
[Journal]
Storage=volatile
RuntimeMaxUse=8M
RuntimeMaxFileSize=2M
ForwardToConsole=no
"""
DPKG_UNSAFE_IO = """\
# simfleet: nodes are throw-away; do not fsync every unpacked file.
force-unsafe-io
"""
APT_CONF = """\
// simfleet: no translation indexes.
Acquire::Languages "none";
"""


# ---------------------------------------------------------------------------------------------
# host


def _stderr(msg: str) -> None:
    print("simfleet: " + msg, file=sys.stderr, flush=True)


def check_host(extra: tuple = ()) -> None:
    """Fail with the exact ``apt-get install`` line when a host requirement is missing.

    Checks: running as root, overlayfs in /proc/filesystems (or loadable), every command/file of
    ``HOST_REQUIREMENTS`` plus ``extra`` (same shape) and the GPU simulation's own
    ``simfleet.gpu.HOST_REQUIREMENTS`` when it declares one. Raises SimfleetError.
    """
    if os.geteuid() != 0:
        raise SimfleetError("simfleet needs root (overlay mounts, systemd-nspawn); run it as root")
    requirements = list(HOST_REQUIREMENTS) + list(extra)
    try:
        from simfleet import gpu  # pylint: disable=import-outside-toplevel

        requirements.extend(getattr(gpu, "HOST_REQUIREMENTS", ()))
    except ImportError:
        pass
    missing: list[str] = []
    for what, package in requirements:
        found = os.path.exists(what) if what.startswith("/") else shutil.which(what)
        if not found and package not in missing:
            missing.append(package)
    if missing:
        raise SimfleetError(
            "missing host packages: %s; install them with:\n  apt-get install -y %s"
            % (", ".join(missing), " ".join(missing))
        )
    if not _has_overlayfs():
        raise SimfleetError("the kernel has no overlay filesystem (modprobe overlay failed)")


def _has_overlayfs() -> bool:
    def listed() -> bool:
        with open("/proc/filesystems", encoding="ascii") as f:
            return any(line.split()[-1:] == ["overlay"] for line in f)

    if listed():
        return True
    run(["modprobe", "overlay"], check=False)
    return listed()


def detect_mirror(paths: list[str] | None = None) -> str:
    """The Debian archive URI the host's apt uses for ``bookworm`` (not -security/-updates).

    Reads one-line ``/etc/apt/sources.list`` / ``*.list`` entries and deb822 ``*.sources``
    stanzas (sources.list(5)); returns ``DEFAULT_MIRROR`` when none names a bookworm main suite.
    ``$SIMFLEET_MIRROR`` overrides the detection.
    """
    if os.environ.get("SIMFLEET_MIRROR"):
        return os.environ["SIMFLEET_MIRROR"]
    if paths is None:
        paths = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*"))
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if path.endswith(".sources"):
            found = _mirror_from_deb822(text)
        else:
            found = _mirror_from_one_line(text)
        if found:
            return found
    return DEFAULT_MIRROR


def _mirror_from_one_line(text: str) -> str | None:
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^]]*\]", " ", line)
        parts = line.split()
        if len(parts) >= 4 and parts[2] == SUITE and "main" in parts[3:]:
            return parts[1]
    return None


def _mirror_from_deb822(text: str) -> str | None:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _sep, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in fields.get("types", "").split():
            continue
        if SUITE in fields.get("suites", "").split() and "main" in fields.get("components", "").split():
            uris = fields.get("uris", "").split()
            if uris:
                return uris[0]
    return None


# ---------------------------------------------------------------------------------------------
# cache keys


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


def debootstrap_key() -> str:
    """Cache key of the debootstrap directory (suite, variant, packages, format)."""
    return _sha({"suite": SUITE, "variant": VARIANT, "packages": sorted(BASE_PACKAGES), "format": DEBOOTSTRAP_FORMAT})[:16]


def gpu_files_digest() -> str:
    """sha256 over every file of the GPU simulation package (``simfleet/gpu``) and the host's pynvml.

    The node layer and the driver packages are rebuilt whenever this changes.
    """
    h = hashlib.sha256()
    root = os.path.join(PACKAGE_DIR, "gpu")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode("utf-8") + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
            h.update(b"\0%o\0" % (os.stat(path).st_mode & 0o777))
    spec = importlib.util.find_spec("pynvml")
    if spec and spec.origin and os.path.isfile(spec.origin):
        with open(spec.origin, "rb") as f:
            h.update(b"pynvml\0" + f.read())
    return h.hexdigest()


def layer_key() -> str:
    """Cache key of the node layer (debootstrap key, trimming, GPU simulation files)."""
    return _sha({"debootstrap": debootstrap_key(), "trim": TRIM_FORMAT, "gpu": gpu_files_digest()})[:16]


# ---------------------------------------------------------------------------------------------
# building


def _cleanup_stale(cache: str) -> None:
    """Remove half-built directories of builds whose process is gone."""
    for path in glob.glob(os.path.join(cache, "*.tmp-*")):
        try:
            pid = int(path.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid_alive(pid) and pid != os.getpid():
            continue
        unmount_under(path)
        shutil.rmtree(path, ignore_errors=True)


def build_debootstrap(cache: str, mirror: str, log: Callable[[str], None]) -> str:
    """Make (or reuse) the debootstrap directory; return its root filesystem path."""
    final = os.path.join(cache, "debootstrap-" + debootstrap_key())
    rootfs = os.path.join(final, "rootfs")
    if os.path.exists(os.path.join(final, "complete")):
        return rootfs
    tmp = "%s.tmp-%d" % (final, os.getpid())
    os.makedirs(tmp)
    debs = os.path.join(cache, "debs-debootstrap")
    os.makedirs(debs, exist_ok=True)
    log("building the Debian 12 base with debootstrap from %s (about 1.5 minutes)" % mirror)
    started = time.monotonic()
    argv = [
        "debootstrap",
        "--variant=" + VARIANT,
        "--include=" + ",".join(BASE_PACKAGES),
        "--components=main",
        "--cache-dir=" + debs,
        "--keyring=" + DEBIAN_KEYRING,
        SUITE,
        os.path.join(tmp, "rootfs"),
        mirror,
    ]
    with open(os.path.join(tmp, "debootstrap.log"), "w", encoding="utf-8") as out:
        proc = run(argv, check=False, stdout=out, stderr=out)
    if proc.returncode != 0:
        tail = _tail(os.path.join(tmp, "debootstrap.log"))
        raise SimfleetError(
            "debootstrap failed (status %d) with mirror %s; set SIMFLEET_MIRROR or --mirror to a "
            "reachable Debian mirror. Last lines:\n%s" % (proc.returncode, mirror, tail)
        )
    tmp_root = os.path.join(tmp, "rootfs")
    for junk in glob.glob(os.path.join(tmp_root, "var/cache/apt/archives/*.deb")) + glob.glob(
        os.path.join(tmp_root, "var/cache/apt/*.bin")
    ):
        os.unlink(junk)
    with open(os.path.join(tmp, "complete"), "w", encoding="utf-8") as f:
        json.dump({"mirror": mirror, "packages": list(BASE_PACKAGES), "seconds": round(time.monotonic() - started, 1)}, f)
    os.rename(tmp, final)
    log("base built in %.0f s" % (time.monotonic() - started))
    return rootfs


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def trim_rootfs(rootfs: str) -> None:
    """Make a debootstrap root filesystem a lean test node.

    Disables timers and services a short-lived test node does not need (``UNWANTED_LINKS``),
    masks the consoles (``MASKED_UNITS``), keeps the journal in memory and small, lets dpkg skip
    fsync, removes the SSH host keys and the machine id (each node gets its own at creation).
    """
    for rel in UNWANTED_LINKS:
        path = os.path.join(rootfs, rel)
        if os.path.lexists(path):
            os.unlink(path)
    system = os.path.join(rootfs, "etc/systemd/system")
    for unit in MASKED_UNITS:
        path = os.path.join(system, unit)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink("/dev/null", path)
    write_file(os.path.join(rootfs, "etc/systemd/journald.conf.d/simfleet.conf"), JOURNALD_CONF)
    write_file(os.path.join(rootfs, "etc/dpkg/dpkg.cfg.d/simfleet-unsafe-io"), DPKG_UNSAFE_IO)
    write_file(os.path.join(rootfs, "etc/apt/apt.conf.d/90simfleet"), APT_CONF)
    for key in glob.glob(os.path.join(rootfs, "etc/ssh/ssh_host_*")):
        os.unlink(key)
    write_file(os.path.join(rootfs, "etc/machine-id"), "")
    dbus_id = os.path.join(rootfs, "var/lib/dbus/machine-id")
    if os.path.lexists(dbus_id):
        os.unlink(dbus_id)
    os.symlink("/etc/machine-id", dbus_id)


def build_layer(cache: str, debootstrap_rootfs: str, log: Callable[[str], None]) -> str:
    """Make (or reuse) the node layer over ``debootstrap_rootfs``; return its directory.

    The layer is the upper directory of an overlay mounted over the debootstrap base while
    ``trim_rootfs`` and ``simfleet.gpu.nodefiles.install_into_rootfs`` run on the merged tree
    (``redirect_dir`` and ``metacopy`` off, so the result is a plain layer usable as a lower one).
    """
    from simfleet.gpu import nodefiles  # pylint: disable=import-outside-toplevel

    final = os.path.join(cache, "layer-" + layer_key())
    layer = os.path.join(final, "rootfs")
    if os.path.exists(os.path.join(final, "complete")):
        return layer
    tmp = "%s.tmp-%d" % (final, os.getpid())
    upper, work, merged = (os.path.join(tmp, d) for d in ("rootfs", "work", "merged"))
    for d in (upper, work, merged):
        os.makedirs(d)
    log("building the node layer (trimmed units, simulated GPU files)")
    started = time.monotonic()
    opts = "lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off" % (debootstrap_rootfs, upper, work)
    run(["mount", "-t", "overlay", "overlay", "-o", opts, merged])
    try:
        trim_rootfs(merged)
        nodefiles.install_into_rootfs(merged)
    finally:
        unmount_under(merged)
    shutil.rmtree(work)
    os.rmdir(merged)
    with open(os.path.join(tmp, "complete"), "w", encoding="utf-8") as f:
        json.dump({"debootstrap": debootstrap_rootfs, "seconds": round(time.monotonic() - started, 1)}, f)
    os.rename(tmp, final)
    return layer


def ensure_base(cache: str, mirror: str | None = None, log: Callable[[str], None] = _stderr) -> list[str]:
    """Build what is missing of the base and return the overlay lower directories, top first.

    Serialised by ``<cache>/base.lock`` so concurrent ``up`` commands build it once.
    """
    os.makedirs(cache, exist_ok=True)
    with file_lock(os.path.join(cache, "base.lock"), "(building the base)"):
        _cleanup_stale(cache)
        deb_root = build_debootstrap(cache, mirror or detect_mirror(), log)
        layer = build_layer(cache, deb_root, log)
    return [layer, deb_root]


def cached_dirs(cache: str) -> list[str]:
    """The base directories present in the cache (debootstrap-*, layer-*, packages-*, slurm-*)."""
    return sorted(
        p
        for pattern in ("debootstrap-*", "layer-*", "packages-*", "slurm-*")
        for p in glob.glob(os.path.join(cache, pattern))
        if ".tmp-" not in p
    )


def remove_cached(path: str) -> None:
    """Delete one cached directory (refuses when anything is mounted below it)."""
    if mounts_under(path):
        raise SimfleetError("%s is still mounted below; stop the fleets that use it first" % path)
    shutil.rmtree(path)
