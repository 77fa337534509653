# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Simulated NVIDIA driver packages for Debian 12, named and versioned like the CUDA repository.

Package names follow NVIDIA's ``repos/debian12/x86_64`` repository: the driver binaries are
unsuffixed in every branch (``nvidia-driver``, ``nvidia-driver-cuda``, ``nvidia-driver-libs``,
``nvidia-kernel-dkms``, ``nvidia-kernel-open-dkms``, ``nvidia-kernel-support``,
``firmware-nvidia-gsp``, ``libcuda1``, ``libnvidia-ml1``, ``nvidia-smi``, ``nvidia-persistenced``),
the metas are ``cuda-drivers``, ``cuda-drivers-<branch>`` (lower-bound dependencies only) and
``nvidia-open``, fabric manager is ``nvidia-fabricmanager-<branch>`` up to R575 and
``nvidia-fabricmanager`` from R580, and from R580 on there are ``nvidia-driver-pinning-<branch>``
and ``nvidia-driver-pinning-<version>`` (apt preferences, Pin-Priority 1000, one at a time).
R620 has no proprietary kernel module package. Versions are ``<x.y.z>-1``. Sources of names
and versions: tests/simfleet/README.md, section "GPU simulation".

What the packages do on a node: ``libnvidia-ml1`` installs ``libnvidia-ml.so.<version>`` (the
userspace version the simulation reads) and ``libnvidia-ml.so.1``; the kernel-module packages'
``postinst`` "builds" stand-in modules for the running kernel (ELF objects with a
``.modinfo`` section made by ``as`` + ``objcopy``, installed in
``/lib/modules/$(uname -r)/updates/dkms/``, ``depmod``) and fails with exit status 10 (as a
failed DKMS build does) when the node's state has a ``build_fail`` fault for that version; their
``prerm`` removes the modules; ``nvidia-smi``, ``nvidia-persistenced`` and
``nvidia-fabricmanager`` install front ends to the node-side ``simgpu`` library.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from typing import Any, Dict, List, Optional, Tuple

#: Branches simulated: class, end of life, versions (oldest first), flavors offered.
BRANCHES: Dict[str, Dict[str, Any]] = {
    "535": {"class": "ltsb", "eol": True, "versions": ["535.54.03", "535.129.03"], "proprietary": True},
    "570": {"class": "pb", "eol": True, "versions": ["570.133.20", "570.172.08"], "proprietary": True},
    "580": {"class": "ltsb", "eol": False, "versions": ["580.105.08", "580.126.20", "580.178.04"],
            "proprietary": True},
    "595": {"class": "pb", "eol": False, "versions": ["595.71.05", "595.91.07"], "proprietary": True},
    "620": {"class": "ltsb", "eol": False, "versions": ["620.70.06", "620.82.01"], "proprietary": False},
}
#: Versions that are not known real releases (a second R620 version was needed).
INVENTED_VERSIONS = ("620.82.01",)
PINNING_FROM_BRANCH = 580
UNSUFFIXED_FABRICMANAGER_FROM_BRANCH = 580
MAINTAINER = "simfleet <simfleet@localhost.invalid>"
_MODULES = "nvidia nvidia-modeset nvidia-uvm nvidia-drm nvidia-peermem"
_PINNED_NAMES = ("nvidia-driver nvidia-driver-cuda nvidia-driver-libs nvidia-kernel-dkms nvidia-kernel-open-dkms "
                 "nvidia-kernel-support firmware-nvidia-gsp libcuda1 libnvidia-ml1 nvidia-smi nvidia-persistenced "
                 "nvidia-open cuda-drivers cuda-drivers-* nvidia-fabricmanager nvidia-fabricmanager-*")

POSTINST_DKMS = r"""#!/bin/sh
# Simulated DKMS build of the NVIDIA kernel modules (simfleet GPU simulation).
set -e
VERSION="@VERSION@"
LICENSE="@LICENSE@"
SRCNAME="@SRCNAME@"
ROOT="${SIMGPU_ROOT:-}"
ROOT="${ROOT%/}"
KVER="${SIMGPU_KERNEL_RELEASE:-$(uname -r)}"
STATE="$ROOT/var/lib/simgpu/state.json"
DKMS_DIR="$ROOT/var/lib/dkms/nvidia/$VERSION"

build_fails() {
    [ -f "$STATE" ] || return 1
    python3 - "$STATE" "$VERSION" <<'PY'
import json, sys
try:
    with open(sys.argv[1]) as handle:
        faults = json.load(handle).get("faults") or {}
except (OSError, ValueError):
    sys.exit(1)
wanted = faults.get("build_fail") or []
sys.exit(0 if ("*" in wanted or sys.argv[2] in wanted) else 1)
PY
}

case "$1" in
configure)
    echo "Loading new nvidia-$VERSION DKMS files..."
    mkdir -p "$DKMS_DIR/build"
    ln -sfn "/usr/src/$SRCNAME-$VERSION" "$DKMS_DIR/source"
    echo "Building for $KVER"
    echo "Building initial module for $KVER"
    if build_fails; then
        {
            printf 'make -j2 KERNELRELEASE=%s modules\n' "$KVER"
            printf 'nvidia/nv.c: error: simulated build failure (fault build_fail %s)\n' "$VERSION"
            printf 'make: *** [Makefile:85: modules] Error 2\n'
        } > "$DKMS_DIR/build/make.log"
        echo "Error! Bad return status for module build on kernel: $KVER (x86_64)" >&2
        echo "Consult /var/lib/dkms/nvidia/$VERSION/build/make.log for more information." >&2
        exit 10
    fi
    MODDIR="$ROOT/lib/modules/$KVER/updates/dkms"
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    as -o "$TMP/empty.o" /dev/null
    mkdir -p "$MODDIR"
    for name in @MODULES@; do
        modname=$(echo "$name" | tr - _)
        printf 'version=%s\000supported=external\000license=%s\000' "$VERSION" "$LICENSE" > "$TMP/modinfo"
        if [ "$name" = nvidia ]; then
            {
                printf 'description=NVIDIA core GPU kernel module\000'
                printf 'firmware=nvidia/%s/gsp_ga10x.bin\000firmware=nvidia/%s/gsp_tu10x.bin\000' "$VERSION" "$VERSION"
                printf 'alias=char-major-195-*\000'
            } >> "$TMP/modinfo"
        fi
        printf 'name=%s\000vermagic=%s SMP preempt mod_unload modversions \000' "$modname" "$KVER" >> "$TMP/modinfo"
        objcopy --add-section .modinfo="$TMP/modinfo" --set-section-flags .modinfo=alloc,readonly \
            "$TMP/empty.o" "$TMP/$name.ko"
        install -m 0644 "$TMP/$name.ko" "$MODDIR/$name.ko"
    done
    for f in modules.order modules.builtin modules.builtin.modinfo; do
        [ -e "$ROOT/lib/modules/$KVER/$f" ] || : > "$ROOT/lib/modules/$KVER/$f"
    done
    echo "Done."
    echo ""
    echo "nvidia.ko:"
    echo "Running module version sanity check."
    echo " - Original module"
    echo "   - No original module exists within this kernel"
    echo " - Installation"
    echo "   - Installing to /lib/modules/$KVER/updates/dkms/"
    echo "depmod..."
    if [ -n "$ROOT" ]; then depmod -b "$ROOT" -a "$KVER"; else depmod -a "$KVER"; fi
    ;;
esac
exit 0
"""

PRERM_DKMS = r"""#!/bin/sh
# Remove the simulated NVIDIA kernel modules (simfleet GPU simulation).
set -e
VERSION="@VERSION@"
ROOT="${SIMGPU_ROOT:-}"
ROOT="${ROOT%/}"
case "$1" in
remove|upgrade|deconfigure|failed-upgrade)
    echo "Deleting module nvidia-$VERSION completely from the DKMS tree."
    for dir in "$ROOT"/lib/modules/*/updates/dkms; do
        [ -d "$dir" ] || continue
        removed=
        for name in @MODULES@; do
            if [ -e "$dir/$name.ko" ]; then
                rm -f "$dir/$name.ko"
                removed=1
            fi
        done
        if [ -n "$removed" ]; then
            kver=$(basename "$(dirname "$(dirname "$dir")")")
            if [ -n "$ROOT" ]; then depmod -b "$ROOT" -a "$kver"; else depmod -a "$kver"; fi
        fi
    done
    rm -rf "$ROOT/var/lib/dkms/nvidia/$VERSION"
    ;;
esac
exit 0
"""

_WRAPPER = "#!/bin/sh\n# Front end of the simfleet GPU simulation.\nexec /usr/bin/python3 /usr/lib/simgpu/bin/simgpu %s \"$@\"\n"

_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (simfleet simulation)
After=simgpu-boot.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/nvidia-persistenced
ExecStop=/usr/bin/nvidia-persistenced --stop

[Install]
WantedBy=multi-user.target
"""

_FABRICMANAGER_UNIT = """[Unit]
Description=NVIDIA fabric manager service (simfleet simulation)
After=simgpu-boot.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
ExecStop=/usr/bin/nv-fabricmanager --stop

[Install]
WantedBy=multi-user.target
"""


class Package:
    """One binary package to build: control fields, files and maintainer scripts."""

    def __init__(self, name: str, version: str, description: str, section: str = "contrib/libs",
                 architecture: str = "amd64") -> None:
        self.name = name
        self.version = version
        self.description = description
        self.section = section
        self.architecture = architecture
        self.fields: Dict[str, str] = {}
        self.files: Dict[str, Tuple[bytes, int]] = {}
        self.links: Dict[str, str] = {}
        self.scripts: Dict[str, str] = {}

    def add_file(self, path: str, content: Any, mode: int = 0o644) -> None:
        """Ship ``content`` (str or bytes) at absolute ``path``."""
        self.files[path] = (content.encode() if isinstance(content, str) else content, mode)

    def control(self) -> str:
        """The DEBIAN/control text."""
        lines = ["Package: %s" % self.name, "Source: nvidia-graphics-drivers", "Version: %s" % self.version,
                 "Architecture: %s" % self.architecture, "Maintainer: %s" % MAINTAINER,
                 "Section: %s" % self.section, "Priority: optional", "Homepage: https://www.nvidia.com/"]
        for key in ("Pre-Depends", "Depends", "Recommends", "Provides", "Conflicts", "Replaces", "Breaks"):
            if self.fields.get(key):
                lines.append("%s: %s" % (key, self.fields[key]))
        summary, _newline, body = self.description.partition("\n")
        lines.append("Description: %s" % summary)
        body = body or "Simulated package of the gpufleet.nvidia test fleet; it carries no NVIDIA software."
        lines.extend(" " + line if line else " ." for line in body.splitlines())
        return "\n".join(lines) + "\n"


def _branch_int(version: str) -> int:
    return int(version.split(".")[0])


def _debver(version: str) -> str:
    return version + "-1"


def _shared_object(soname: str, workdir: str) -> Optional[bytes]:
    """A real (empty) ELF shared object with ``soname``, so ldconfig on the node accepts it."""
    if not (shutil.which("as") and shutil.which("ld")):
        return None
    obj = os.path.join(workdir, "empty.o")
    out = os.path.join(workdir, soname + ".built")
    subprocess.run(["as", "-o", obj, "/dev/null"], check=True)
    subprocess.run(["ld", "-shared", "-soname", soname, "-o", out, obj], check=True)
    with open(out, "rb") as handle:
        return handle.read()


def packages_for_version(branch: str, version: str, libs: Dict[str, Optional[bytes]]) -> List[Package]:
    """All driver packages of one driver ``version`` (of ``branch``)."""
    spec = BRANCHES[branch]
    dv = _debver(version)
    eq = "(= %s)" % dv
    first = _debver(spec["versions"][0])
    branch_no = int(branch)
    pkgs: List[Package] = []

    support = Package("nvidia-kernel-support", dv, "NVIDIA binary kernel module support files", "contrib/kernel")
    support.add_file("/usr/share/doc/nvidia-kernel-support/simgpu-version", version + "\n")
    pkgs.append(support)

    gsp = Package("firmware-nvidia-gsp", dv, "NVIDIA GSP firmware", "contrib/kernel")
    for chip in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        gsp.add_file("/lib/firmware/nvidia/%s/%s" % (version, chip), b"simgpu GSP firmware stand-in\n")
    pkgs.append(gsp)

    flavors = [("open", "nvidia-kernel-open-dkms", "nvidia-open", "Dual MIT/GPL")]
    if spec["proprietary"]:
        flavors.insert(0, ("proprietary", "nvidia-kernel-dkms", "nvidia", "NVIDIA"))
    names = [f[1] for f in flavors]
    for flavor, name, srcname, license_ in flavors:
        pkg = Package(name, dv, "NVIDIA %s kernel module (DKMS source)" % (
            "open GPU" if flavor == "open" else "binary"), "contrib/kernel")
        pkg.fields["Depends"] = "nvidia-kernel-support %s, firmware-nvidia-gsp %s, binutils, kmod" % (eq, eq)
        pkg.fields["Provides"] = "nvidia-kernel-%s" % version + (", nvidia-open-kernel-%s" % version
                                                                 if flavor == "open" else "")
        others = [n for n in ("nvidia-kernel-dkms", "nvidia-kernel-open-dkms") if n != name]
        pkg.fields["Conflicts"] = ", ".join(others)
        pkg.add_file("/usr/src/%s-%s/dkms.conf" % (srcname, version),
                     'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="%s"\nAUTOINSTALL="yes"\n' % version)
        for script, template in (("postinst", POSTINST_DKMS), ("prerm", PRERM_DKMS)):
            pkg.scripts[script] = (template.replace("@VERSION@", version).replace("@LICENSE@", license_)
                                   .replace("@SRCNAME@", srcname).replace("@MODULES@", _MODULES))
        pkgs.append(pkg)

    nvml = Package("libnvidia-ml1", dv, "NVIDIA Management Library (NVML) runtime library")
    nvml.fields["Depends"] = "nvidia-kernel-support %s" % eq
    nvml.add_file("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.%s" % version,
                  libs["libnvidia-ml.so.1"] or ("simgpu NVML stand-in %s\n" % version).encode())
    nvml.links["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] = "libnvidia-ml.so.%s" % version
    pkgs.append(nvml)

    cuda = Package("libcuda1", dv, "NVIDIA CUDA Driver Library")
    cuda.fields["Depends"] = "nvidia-kernel-support %s" % eq
    cuda.add_file("/usr/lib/x86_64-linux-gnu/libcuda.so.%s" % version,
                  libs["libcuda.so.1"] or ("simgpu CUDA stand-in %s\n" % version).encode())
    cuda.links["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] = "libcuda.so.%s" % version
    pkgs.append(cuda)

    smi = Package("nvidia-smi", dv, "NVIDIA System Management Interface", "contrib/utils")
    smi.fields["Depends"] = "libnvidia-ml1 %s" % eq
    smi.add_file("/usr/bin/nvidia-smi", _WRAPPER % "nvidia-smi", 0o755)
    pkgs.append(smi)

    persist = Package("nvidia-persistenced", dv, "daemon to maintain persistent software state in the NVIDIA driver",
                      "contrib/utils")
    persist.fields["Depends"] = "libnvidia-ml1 %s" % eq
    persist.add_file("/usr/bin/nvidia-persistenced", _WRAPPER % "persistenced", 0o755)
    persist.add_file("/lib/systemd/system/nvidia-persistenced.service", _PERSISTENCED_UNIT)
    pkgs.append(persist)

    libs_meta = Package("nvidia-driver-libs", dv, "NVIDIA metapackage (libraries)", "contrib/libs")
    libs_meta.fields["Depends"] = "libnvidia-ml1 %s, libcuda1 %s" % (eq, eq)
    pkgs.append(libs_meta)

    cuda_meta = Package("nvidia-driver-cuda", dv, "NVIDIA driver CUDA integration components", "contrib/libs")
    cuda_meta.fields["Depends"] = "libcuda1 %s, libnvidia-ml1 %s, nvidia-smi %s, nvidia-persistenced %s" % (
        eq, eq, eq, eq)
    pkgs.append(cuda_meta)

    driver = Package("nvidia-driver", dv, "NVIDIA metapackage", "contrib/x11")
    kernel_alt = " | ".join("%s %s" % (name, eq) for name in names)
    driver.fields["Depends"] = "nvidia-driver-libs %s, nvidia-driver-cuda %s, %s, firmware-nvidia-gsp %s" % (
        eq, eq, kernel_alt, eq)
    pkgs.append(driver)

    open_meta = Package("nvidia-open", dv, "NVIDIA driver metapackage with open GPU kernel modules", "contrib/x11")
    open_meta.fields["Depends"] = "nvidia-driver (>= %s), nvidia-kernel-open-dkms (>= %s)" % (dv, dv)
    pkgs.append(open_meta)

    kernel_meta = "nvidia-kernel-dkms" if spec["proprietary"] else "nvidia-kernel-open-dkms"
    branch_meta = Package("cuda-drivers-%s" % branch, dv, "CUDA Driver meta-package, branch %s" % branch,
                          "contrib/metapackages")
    branch_meta.fields["Depends"] = "nvidia-driver (>= %s), nvidia-driver-cuda (>= %s), %s (>= %s)" % (
        first, first, kernel_meta, first)
    pkgs.append(branch_meta)

    meta = Package("cuda-drivers", dv, "CUDA Driver meta-package", "contrib/metapackages")
    meta.fields["Depends"] = "cuda-drivers-%s %s" % (branch, eq)
    pkgs.append(meta)

    fm_name = "nvidia-fabricmanager" if branch_no >= UNSUFFIXED_FABRICMANAGER_FROM_BRANCH \
        else "nvidia-fabricmanager-%s" % branch
    fm = Package(fm_name, dv, "Fabric Manager for NVSwitch based systems", "contrib/utils")
    provides = ["nvidia-fabricmanager-any"]
    if fm_name == "nvidia-fabricmanager":
        provides.append("nvidia-fabricmanager-%s %s" % (branch, eq))
    fm.fields["Provides"] = ", ".join(provides)
    fm.fields["Conflicts"] = "nvidia-fabricmanager-any"
    fm.fields["Replaces"] = "nvidia-fabricmanager-any"
    fm.add_file("/usr/bin/nv-fabricmanager", "#!/bin/sh\n# Front end of the simfleet GPU simulation.\n"
                "exec /usr/bin/python3 /usr/lib/simgpu/bin/simgpu fabricmanager --version %s \"$@\"\n" % version, 0o755)
    fm.add_file("/lib/systemd/system/nvidia-fabricmanager.service", _FABRICMANAGER_UNIT)
    fm.add_file("/usr/share/nvidia/nvswitch/fabricmanager.cfg", "LOG_LEVEL=4\nFABRIC_MODE=0\n")
    pkgs.append(fm)

    if branch_no >= PINNING_FROM_BRANCH:
        pin = Package("nvidia-driver-pinning-%s" % version, dv, "APT driver pinning file for driver version %s"
                      % version, "contrib/metapackages", "all")
        _pinning(pin, "%s-*" % version)
        pkgs.append(pin)
    for pkg in pkgs:
        for path in list(pkg.files):
            if path.startswith("/usr/share/doc/"):
                break
        else:
            pkg.add_file("/usr/share/doc/%s/simgpu-version" % pkg.name, version + "\n")
    return pkgs


def _pinning(pkg: Package, pin_version: str) -> None:
    pkg.fields["Provides"] = "nvidia-driver-pinning"
    pkg.fields["Conflicts"] = "nvidia-driver-pinning"
    pkg.fields["Replaces"] = "nvidia-driver-pinning"
    pkg.add_file("/etc/apt/preferences.d/nvidia-driver-pin",
                 "# %s (simfleet simulation)\nPackage: %s\nPin: version %s\nPin-Priority: 1000\n"
                 % (pkg.description.splitlines()[0], _PINNED_NAMES, pin_version))


def branch_pinning_package(branch: str) -> Package:
    """``nvidia-driver-pinning-<branch>`` (version ``<branch>-1``): pins every driver package to ``<branch>.*``."""
    pkg = Package("nvidia-driver-pinning-%s" % branch, "%s-1" % branch,
                  "APT driver pinning file for driver branch %s" % branch, "contrib/metapackages", "all")
    _pinning(pkg, "%s.*" % branch)
    return pkg


def all_packages(workdir: str) -> List[Package]:
    """Every package of every simulated branch (see BRANCHES)."""
    libs = {"libnvidia-ml.so.1": _shared_object("libnvidia-ml.so.1", workdir),
            "libcuda.so.1": _shared_object("libcuda.so.1", workdir)}
    out: List[Package] = []
    for branch, spec in BRANCHES.items():
        for version in spec["versions"]:
            out.extend(packages_for_version(branch, version, libs))
        if int(branch) >= PINNING_FROM_BRANCH:
            out.append(branch_pinning_package(branch))
    return out


def _deb_name(pkg: Package) -> str:
    return "%s_%s_%s.deb" % (pkg.name, pkg.version, pkg.architecture)


def build_package(pkg: Package, out_dir: str, workdir: str) -> str:
    """Build one .deb with ``dpkg-deb`` into ``out_dir``; return its path."""
    tree = tempfile.mkdtemp(prefix=pkg.name + ".", dir=workdir)
    debian = os.path.join(tree, "DEBIAN")
    os.makedirs(debian)
    for path, (content, mode) in pkg.files.items():
        target = os.path.join(tree, path.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(content)
        os.chmod(target, mode)
    for path, dest in pkg.links.items():
        target = os.path.join(tree, path.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(dest, target)
    with open(os.path.join(debian, "control"), "w", encoding="utf-8") as handle:
        handle.write(pkg.control())
    for script, text in pkg.scripts.items():
        path = os.path.join(debian, script)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, 0o755)
    for root, dirs, _files in os.walk(tree):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(tree, 0o755)
    out = os.path.join(out_dir, _deb_name(pkg))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", tree, out],
                   check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(tree, ignore_errors=True)
    return out


def _digest() -> str:
    with open(__file__, "rb") as handle:
        source = handle.read()
    return hashlib.sha256(source + json.dumps(BRANCHES, sort_keys=True).encode()).hexdigest()


def build_packages(out_dir: str) -> List[str]:
    """Build every simulated driver package into ``out_dir``; return the .deb paths (sorted).

    Rebuilds only when this module changed since the last build into ``out_dir`` (a stamp file
    ``.simgpu-pkgbuild.stamp`` records the digest and the file list). Needs ``dpkg-deb``;
    ``as``/``ld`` make the library stand-ins real ELF shared objects when present.
    """
    os.makedirs(out_dir, exist_ok=True)
    stamp = os.path.join(out_dir, ".simgpu-pkgbuild.stamp")
    digest = _digest()
    try:
        with open(stamp, "r", encoding="utf-8") as handle:
            recorded = json.load(handle)
        if recorded.get("digest") == digest:
            paths = [os.path.join(out_dir, name) for name in recorded.get("files", [])]
            if paths and all(os.path.isfile(p) for p in paths):
                return sorted(paths)
    except (OSError, ValueError):
        pass
    workdir = tempfile.mkdtemp(prefix="simgpu-pkgbuild.")
    try:
        packages = all_packages(workdir)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2))) as pool:
            paths = list(pool.map(lambda p: build_package(p, out_dir, workdir), packages))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    with open(stamp, "w", encoding="utf-8") as handle:
        json.dump({"digest": digest, "files": sorted(os.path.basename(p) for p in paths)}, handle)
    return sorted(paths)
