# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Driver versions and the ``driver.state`` verdict.

Three versions describe an NVIDIA driver on a node, and they can disagree:

* **userspace** - the libraries (``libnvidia-ml.so``, ``libcuda.so``) and tools: NVML
  ``nvmlSystemGetDriverVersion``, ``nvidia-smi``'s ``<driver_version>``, or the installed driver
  packages (dpkg / rpm);
* **loaded** - the kernel module in memory: ``/sys/module/nvidia/version`` or
  ``/proc/driver/nvidia/version``;
* **on disk** - the kernel module that the *running* kernel loads at the next boot:
  ``modinfo nvidia`` (``modinfo -F version nvidia``).

The parsers here turn the text of those sources into dictionaries; :func:`driver_state` turns
the versions and a little evidence into one of ``not_installed``, ``not_loaded``, ``ok``,
``reboot_pending``, ``broken`` (see the design notes, "Facts" → ``driver``). Everything is pure:
text in, dictionaries out; nothing here reads a file or runs a command.

Versions are compared for **exact equality** of the upstream version (:func:`versions_match`):
the kernel module and the userspace must be the same build, and the same branch is not enough
(NVIDIA Fabric Manager refuses 530.30.02 with driver 530.41.03, field case 11). Nothing here
orders versions; where ordering is needed, use
``ansible.module_utils.compat.version.LooseVersion`` on :func:`upstream_version` results.

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import nvml_names

# NVML error names as pynvml spells them without the ``NVMLError_`` prefix
# (``pynvml.NVMLError_LibRmVersionMismatch`` ...), from nvml_names.RETURN_CODES.
NVML_LIB_RM_VERSION_MISMATCH = nvml_names.RETURN_CODES[nvml_names.ERROR_LIB_RM_VERSION_MISMATCH]
NVML_DRIVER_NOT_LOADED = nvml_names.RETURN_CODES[nvml_names.ERROR_DRIVER_NOT_LOADED]
NVML_LIBRARY_NOT_FOUND = nvml_names.RETURN_CODES[nvml_names.ERROR_LIBRARY_NOT_FOUND]
NVML_NO_PERMISSION = nvml_names.RETURN_CODES[nvml_names.ERROR_NO_PERMISSION]
NVML_GPU_IS_LOST = nvml_names.RETURN_CODES[nvml_names.ERROR_GPU_IS_LOST]
NVML_UNKNOWN = nvml_names.RETURN_CODES[nvml_names.ERROR_UNKNOWN]

_VERSION_TOKEN = re.compile(r"^\d+\.\d+(?:\.\d+)*$")
_VERSION_IN_TEXT = r"\d+\.\d+(?:\.\d+)*"


# ---------------------------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------------------------


def upstream_version(version: Optional[str]) -> Optional[str]:
    """Strip a package version down to NVIDIA's driver version.

    Debian/Ubuntu versions are ``[epoch:]upstream[-revision]`` (Debian Policy 5.6.12); rpm versions
    are ``[epoch:]version-release``. The epoch (before the first ``:``) and the revision/release
    (after the last ``-``) are removed: ``"580.126.20-1"`` → ``"580.126.20"``,
    ``"460.73.01-0ubuntu0.20.04.1"`` → ``"460.73.01"``, ``"3:580.126.09-1.el9"`` → ``"580.126.09"``.
    NVIDIA driver versions themselves never contain ``-`` or ``:``.

    :param version: a package version, a bare driver version, or ``None``.
    :returns: the upstream version, or ``None`` for ``None``, empty text or ``"<none>"``
        (what ``dpkg -l`` prints for a package that is not installed).
    :raises: nothing.
    """
    if version is None:
        return None
    text = version.strip()
    if not text or text == "<none>":
        return None
    if ":" in text:
        head, rest = text.split(":", 1)
        if head.isdigit():
            text = rest
    if "-" in text:
        text = text.rsplit("-", 1)[0]
    return text or None


def versions_match(a: Optional[str], b: Optional[str]) -> bool:
    """Exact equality of two NVIDIA driver versions.

    Both sides are reduced with :func:`upstream_version` (so a package version may be compared
    with a driver version) and compared as strings: ``"580.126.09"`` matches only
    ``"580.126.09"``; ``"550.120"`` does not match ``"550.127.05"`` and ``"530.30.02"`` does not
    match ``"530.41.03"`` even though the branches agree (field case 11: Fabric Manager and the
    kernel module must be the same build). No prefix matching: ``"595.71"`` does not match
    ``"595.71.05"``.

    :returns: ``True`` only when both are known and equal; ``False`` when they differ or when
        either is ``None``/empty. Callers that must tell "different" from "unknown" test for
        ``None`` first.
    :raises: nothing.
    """
    left = upstream_version(a)
    right = upstream_version(b)
    if left is None or right is None:
        return False
    return left == right


# ---------------------------------------------------------------------------------------------
# Loaded module: /proc/driver/nvidia/version, /sys/module/nvidia/version
# ---------------------------------------------------------------------------------------------


def parse_proc_driver_version(text: Optional[str]) -> Dict[str, Optional[str]]:
    """Parse the contents of ``/proc/driver/nvidia/version``.

    The file has an ``NVRM version:`` line and a ``GCC version:`` line, as printed by the loaded
    ``nvidia.ko``::

        NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  (...)  Wed Aug 13 ...
        NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023
        NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.144.03  Release Build  (...)
        NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.120  Fri Sep 13 11:01:10 UTC 2024
        GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)

    The kernel module type comes from the wording: "Open Kernel Module" is NVIDIA's open
    kernel module (open-gpu-kernel-modules); "<arch> Kernel Module" is the proprietary one. The
    Tegra/Jetson wording "NVIDIA UNIX Kernel Module for aarch64" names neither and gives ``None``.

    :param text: the file's contents, or ``None``.
    :returns: ``{"loaded_version": str|None, "kernel_module_type": "open"|"proprietary"|None,
        "architecture": str|None (``"x86_64"``, ``"aarch64"``), "gcc_version": str|None
        (``"12.3.0"``)}``; every value ``None`` when there is no ``NVRM version:`` line.
    :raises: nothing.
    """
    result = {
        "loaded_version": None,
        "kernel_module_type": None,
        "architecture": None,
        "gcc_version": None,
    }
    if not text:
        return result
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("NVRM version:") and result["loaded_version"] is None:
            body = line[len("NVRM version:"):]
            for token in body.split():
                if _VERSION_TOKEN.match(token):
                    result["loaded_version"] = token
                    break
            open_match = re.search(r"\bOpen Kernel Module for (\S+)", body)
            prop_match = re.search(r"\bNVIDIA UNIX (\S+) Kernel Module\b", body)
            if open_match:
                result["kernel_module_type"] = "open"
                result["architecture"] = open_match.group(1)
            elif prop_match and prop_match.group(1) != "Open":
                result["kernel_module_type"] = "proprietary"
                result["architecture"] = prop_match.group(1)
            else:
                other = re.search(r"\bKernel Module for (\S+)", body)
                if other:
                    result["architecture"] = other.group(1)
        elif line.startswith("GCC version:") and result["gcc_version"] is None:
            gcc = re.search(r"gcc version (\d+(?:\.\d+)*)", line)
            if gcc:
                result["gcc_version"] = gcc.group(1)
    return result


def parse_sys_module_version(text: Optional[str]) -> Optional[str]:
    """Parse ``/sys/module/nvidia/version``, which holds only the loaded module's version.

    :param text: the file's contents (``"580.82.07\\n"``), or ``None``.
    :returns: the version (``"580.82.07"``), or ``None`` when the text is empty or is not a
        version.
    :raises: nothing.
    """
    if not text:
        return None
    token = text.strip().split()[0] if text.strip() else ""
    return token if _VERSION_TOKEN.match(token) else None


# ---------------------------------------------------------------------------------------------
# On disk: modinfo
# ---------------------------------------------------------------------------------------------

_MODULES_PATH = re.compile(r"/lib/modules/([^/]+)/")


def parse_modinfo(text: Optional[str]) -> Dict[str, Any]:
    """Parse the output of ``modinfo nvidia`` or ``modinfo -F version nvidia``.

    ``modinfo`` reads the module that ``modprobe`` would load for the running kernel (or for
    ``-k RELEASE``), i.e. the version that loads at the next boot. Full output is ``key: value``
    lines (``filename:``, ``version:``, ``license:``, ``vermagic:``, ``firmware:`` ...); with
    ``-F version`` only the version is printed. The license tells the flavour: ``Dual MIT/GPL`` is
    the open kernel module, ``NVIDIA`` the proprietary one (both as set by NVIDIA's sources in
    ``MODULE_LICENSE``). The kernel release comes from the path
    ``/lib/modules/<release>/...`` of ``filename``, else from the first word of ``vermagic``.

    :param text: the command's output (stdout, optionally with stderr), or ``None``.
    :returns: ``{"on_disk_version": str|None, "filename": str|None, "license": str|None,
        "kernel_module_type": "open"|"proprietary"|None, "vermagic": str|None,
        "kernel_release": str|None, "firmware": [str], "not_found": bool,
        "error": str|None}``. ``not_found`` is ``True`` for
        ``modinfo: ERROR: Module nvidia not found.`` (no module for that kernel); other
        ``modinfo: ERROR`` lines are returned in ``error``.
    :raises: nothing.
    """
    result = {
        "on_disk_version": None,
        "filename": None,
        "license": None,
        "kernel_module_type": None,
        "vermagic": None,
        "kernel_release": None,
        "firmware": [],
        "not_found": False,
        "error": None,
    }
    if not text:
        return result
    fields_seen = False
    bare_versions = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("modinfo:") and "ERROR" in line:
            if re.search(r"Module \S+ not found", line):
                result["not_found"] = True
            else:
                result["error"] = line
            continue
        match = re.match(r"^([A-Za-z_]+):\s*(.*)$", line)
        if match:
            fields_seen = True
            key, value = match.group(1), match.group(2).strip()
            if key == "version" and result["on_disk_version"] is None:
                result["on_disk_version"] = value or None
            elif key == "filename" and result["filename"] is None:
                result["filename"] = value or None
            elif key == "license" and result["license"] is None:
                result["license"] = value or None
            elif key == "vermagic" and result["vermagic"] is None:
                result["vermagic"] = value or None
            elif key == "firmware" and value:
                result["firmware"].append(value)
            continue
        if _VERSION_TOKEN.match(line):
            bare_versions.append(line)
    if not fields_seen and bare_versions:
        result["on_disk_version"] = bare_versions[0]
    license_text = result["license"]
    if license_text == "Dual MIT/GPL":
        result["kernel_module_type"] = "open"
    elif license_text == "NVIDIA":
        result["kernel_module_type"] = "proprietary"
    if result["filename"]:
        path = _MODULES_PATH.search(result["filename"])
        if path:
            result["kernel_release"] = path.group(1)
    if result["kernel_release"] is None and result["vermagic"]:
        result["kernel_release"] = result["vermagic"].split()[0]
    if result["on_disk_version"] is not None:
        result["not_found"] = False
    return result


_NVIDIA_KO = re.compile(r"^nvidia(?:[-_](?:current|\d+))?\.ko(?:\.(?:xz|zst|gz))?$")


def nvidia_modules_by_kernel(text: Optional[str]) -> Dict[str, List[str]]:
    """Group the ``nvidia.ko`` files of a module listing by kernel release.

    Input is a list of paths, one a line, such as the output of
    ``find /lib/modules/ -name "*nvidia*"``. Only the core driver module counts:
    ``nvidia.ko`` (also compressed ``.ko.xz``/``.ko.zst``/``.ko.gz`` and the old
    ``nvidia_current.ko`` / ``nvidia_<branch>.ko`` names); ``nvidia-uvm``, ``nvidia-drm``,
    ``nvidia-modeset``, the in-tree framebuffer driver ``nvidiafb.ko`` and directories do not.

    :returns: ``{kernel_release: [path, ...]}`` in input order; kernels without an ``nvidia.ko``
        are absent. Field case 24: only ``3.13.0-88-generic`` has one.
    :raises: nothing.
    """
    found = {}  # type: Dict[str, List[str]]
    if not text:
        return found
    for raw in text.splitlines():
        path = raw.strip()
        release = _MODULES_PATH.search(path)
        if not release:
            continue
        if _NVIDIA_KO.match(path.rsplit("/", 1)[-1]):
            found.setdefault(release.group(1), []).append(path)
    return found


def kernel_release_from_uname(text: Optional[str]) -> Optional[str]:
    """Return the kernel release from ``uname -r`` or ``uname -a`` output.

    ``uname -a`` prints ``Linux <hostname> <release> #<build> ...``; ``uname -r`` only the
    release.

    :returns: ``"3.13.0-116-generic"``, or ``None`` for empty input.
    :raises: nothing.
    """
    if not text:
        return None
    for raw in text.splitlines():
        words = raw.split()
        if not words or words[0] == "$":
            continue
        if words[0] == "Linux" and len(words) >= 3:
            return words[2]
        if len(words) == 1:
            return words[0]
    return None


# ---------------------------------------------------------------------------------------------
# Packages: dpkg -l, rpm -qa, apt-mark showhold
# ---------------------------------------------------------------------------------------------

# Which installed packages are "NVIDIA driver packages". Names from NVIDIA's CUDA repositories
# (Debian 12, Ubuntu 22.04/24.04, RHEL 8/9), the Debian/Ubuntu archives and RPM Fusion /
# negativo17 (see docs/facts.md and the package reference): the driver libraries and tools,
# kernel module packages (DKMS, precompiled kmods, Ubuntu's linux-modules-nvidia-*), GSP
# firmware, X driver, Fabric Manager, NSCQ, IMEX, NVSDM and the pinning packages. Not included: the CUDA toolkit, the container toolkit and other NVIDIA
# software with its own version numbers (see _NOT_DRIVER_PACKAGES).
_DRIVER_PACKAGES = re.compile(
    r"^(?:"
    r"nvidia-.+"
    r"|libnvidia-.+"
    r"|cuda-drivers(?:-.+)?"
    r"|libcuda\d+(?:-.+)?"
    r"|libcudadebugger\d+"
    r"|libnvcuvid\d+"
    r"|libnvoptix\d+"
    r"|lib(?:gl|egl|gles|glx)[\w.+]*-nvidia[\w.+-]*"
    r"|firmware-nvidia-.+"
    r"|xserver-xorg-video-nvidia.*"
    r"|xorg-x11-drv-nvidia.*"
    r"|xorg-x11-nvidia.*"
    r"|kmod-nvidia.*"
    r"|akmod-nvidia.*"
    r"|dkms-nvidia.*"
    r"|linux-(?:modules|objects|signatures)-nvidia-.+"
    r"|libnvsdm.*"
    r"|dnf-plugin-nvidia"
    r"|yum-plugin-nvidia"
    r")$"
)

_NOT_DRIVER_PACKAGES = re.compile(
    r"^(?:"
    r"nvidia-container-.+|libnvidia-container.*|nvidia-docker.*"  # container toolkit
    r"|nvidia-cuda-(?:toolkit|dev|gdb|doc|samples).*"  # Debian's CUDA toolkit
    r"|nvidia-(?:cudnn|tensorrt|profiler|visual-profiler|nsight.*|opencl-dev|openjdk.*)"
    r"|nvidia-fs.*|nvidia-gds.*"  # GPUDirect Storage: own version numbers
    r"|nvidia-mig-manager.*|nvidia-driver-assistant|nvidia-prime.*"
    r"|nvidia-l4t-.+|nvidia-jetpack.*"  # Jetson: L4T release numbers
    r"|libxnvctrl.*"  # NV-CONTROL X client library (nvidia-settings): Debian pulls it in with Chromium
    r")$"
)


def is_driver_package(name: str) -> bool:
    """Tell whether a package name belongs to the NVIDIA driver package set.

    Included (prefix patterns): ``nvidia-*``, ``libnvidia-*``, ``cuda-drivers*``, ``libcuda1``,
    ``libcudadebugger1``, ``libnvcuvid1``, ``libnvoptix1``, ``libglx-nvidia0``-style GL
    libraries, ``firmware-nvidia-*`` (GSP firmware), ``xserver-xorg-video-nvidia*``,
    ``xorg-x11-drv-nvidia*``, ``xorg-x11-nvidia``, ``kmod-nvidia*``, ``akmod-nvidia*``,
    ``dkms-nvidia*``, ``linux-modules-nvidia-*`` / ``linux-objects-nvidia-*`` /
    ``linux-signatures-nvidia-*`` (Ubuntu precompiled modules), ``libnvsdm*``,
    ``dnf-plugin-nvidia``. This takes in Fabric Manager (``nvidia-fabricmanager*``,
    ``nvidia-fabric-manager``), NSCQ (``libnvidia-nscq*``), IMEX (``nvidia-imex*``) and the
    pinning packages (``nvidia-driver-pinning-*``).

    Excluded: CUDA toolkit packages (``cuda-toolkit-*``, ``libcudart*``, Debian's
    ``nvidia-cuda-toolkit``/``-dev``/``-gdb``), the container toolkit (``nvidia-container-*``,
    ``libnvidia-container*``, ``nvidia-docker*``), cuDNN/TensorRT/profilers/Nsight, GPUDirect
    Storage (``nvidia-fs*``, ``nvidia-gds*``), ``nvidia-mig-manager``,
    ``nvidia-driver-assistant``, ``nvidia-prime`` and Jetson ``nvidia-l4t-*`` packages: they have
    their own version numbers; ``libxnvctrl*`` (the NV-CONTROL X client library of
    nvidia-settings): it talks to an X server, not to the kernel module, and Debian installs it
    with Chromium on hosts that have no NVIDIA driver.

    :param name: a package name, with or without a ``:arch`` suffix.
    :returns: ``True`` for a driver package.
    :raises: nothing.
    """
    base = name.split(":", 1)[0].strip().lower()
    if not base or _NOT_DRIVER_PACKAGES.match(base):
        return False
    return bool(_DRIVER_PACKAGES.match(base))


_DPKG_ARCHES = frozenset(
    ("all", "amd64", "arm64", "armhf", "armel", "i386", "ppc64el", "s390x", "riscv64", "<none>")
)


def parse_dpkg_l(text: Optional[str], driver_only: bool = True) -> List[Dict[str, Any]]:
    """Parse ``dpkg -l`` output into package records.

    Each package line starts with two or three status letters (``dpkg-query(1)``, "--list"):
    desired action (``u``nknown, ``i``nstall, ``h``old, ``r``emove, ``p``urge), package state
    (``n`` not installed, ``c`` config-files, ``H`` half-installed, ``U`` unpacked, ``F``
    half-configured, ``W`` triggers-awaited, ``t`` triggers-pending, ``i`` installed) and an
    optional error flag (``R`` reinstallation required). Then name (``name[:arch]``), version,
    architecture (absent in output of old dpkg) and description.

    :param text: the output of ``dpkg -l`` (header lines are skipped), or ``None``.
    :param driver_only: keep only NVIDIA driver packages (:func:`is_driver_package`).
    :returns: a list of ``{"name": str (without ``:arch``), "version": str|None (the full
        Debian version, ``None`` for ``<none>``), "upstream_version": str|None,
        "architecture": str|None, "status": str (``"ii"``, ``"hi"``, ``"iU"``, ``"iF"``,
        ``"iHR"``, ``"rc"`` ...), "held": bool (desired action ``h``), "installed": bool
        (state is not ``n``/``c``), "half_configured": bool (state ``U``, ``F``, ``H``, ``W``,
        ``t``, or an error flag)}`` in input order.
    :raises: nothing; lines that are not package lines are skipped.
    """
    packages = []  # type: List[Dict[str, Any]]
    if not text:
        return packages
    has_arch_column = None  # type: Optional[bool]
    for raw in text.splitlines():
        if raw.startswith("||/"):
            has_arch_column = "Architecture" in raw
            continue
        match = re.match(r"^([uihrp])([ncHUFWti])([R ]?)\s+(\S+)\s+(\S+)(?:\s+(\S+))?", raw)
        if not match:
            continue
        desired, state, err = match.group(1), match.group(2), match.group(3).strip()
        name_arch, version, fourth = match.group(4), match.group(5), match.group(6)
        name, _sep, name_suffix = name_arch.partition(":")
        if driver_only and not is_driver_package(name):
            continue
        architecture = None
        if has_arch_column or (has_arch_column is None and fourth in _DPKG_ARCHES):
            architecture = fourth if fourth and fourth != "<none>" else None
        if architecture is None and name_suffix:
            architecture = name_suffix
        version_value = None if version == "<none>" else version
        packages.append(
            {
                "name": name,
                "version": version_value,
                "upstream_version": upstream_version(version_value),
                "architecture": architecture,
                "status": desired + state + err,
                "held": desired == "h",
                "installed": state not in ("n", "c"),
                "half_configured": state in ("U", "F", "H", "W", "t") or bool(err),
            }
        )
    return packages


_RPM_ARCHES = ("x86_64", "noarch", "aarch64", "i686", "i386", "ppc64le", "s390x", "src")


def _split_nevra(text: str) -> Optional[Tuple[str, str, Optional[str]]]:
    """Split ``name-[epoch:]version-release[.arch]`` into (name, [epoch:]version-release, arch)."""
    arch = None
    rest = text
    for candidate in _RPM_ARCHES:
        if rest.endswith("." + candidate):
            arch = candidate
            rest = rest[: -(len(candidate) + 1)]
            break
    parts = rest.rsplit("-", 2)
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2]:
        return None
    name, version, release = parts
    if not re.match(r"^(?:\d+:)?\d", version):
        return None
    return name, version + "-" + release, arch


def parse_rpm_qa(text: Optional[str], driver_only: bool = True) -> List[Dict[str, Any]]:
    """Parse ``rpm -qa`` output into package records.

    The default output is one ``name-version-release.arch`` a line (``rpm(8)``, ``%{NVRA}``),
    e.g. ``nvidia-driver-cuda-libs-580.82.07-1.el9.x86_64``; a ``name-epoch:version-release.arch``
    form (as ``dnf`` prints it) and whitespace-separated ``name [epoch:]version-release [arch]``
    lines (a ``--queryformat`` listing) are accepted too. RPM has no hold or half-configured state
    (a version lock lives in the versionlock plugin's list), so ``held`` and ``half_configured``
    are ``False``.

    :param text: the output of ``rpm -qa``, or ``None``.
    :param driver_only: keep only NVIDIA driver packages (:func:`is_driver_package`).
    :returns: a list of ``{"name", "version" (``[epoch:]version-release``, e.g.
        ``"580.82.07-1.el9"``), "upstream_version" (``"580.82.07"``), "architecture",
        "status": "installed", "held": False, "installed": True, "half_configured": False}``.
    :raises: nothing; lines that do not parse are skipped.
    """
    packages = []  # type: List[Dict[str, Any]]
    if not text:
        return packages
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        parsed = None  # type: Optional[Tuple[str, str, Optional[str]]]
        if len(words) == 1:
            parsed = _split_nevra(words[0])
        elif len(words) in (2, 3) and re.match(r"^(?:\d+:)?\d", words[1]):
            parsed = (words[0], words[1], words[2] if len(words) == 3 else None)
        if parsed is None:
            continue
        name, version, arch = parsed
        if driver_only and not is_driver_package(name):
            continue
        packages.append(
            {
                "name": name,
                "version": version,
                "upstream_version": upstream_version(version),
                "architecture": arch,
                "status": "installed",
                "held": False,
                "installed": True,
                "half_configured": False,
            }
        )
    return packages


def parse_apt_mark_showhold(text: Optional[str]) -> List[str]:
    """Parse ``apt-mark showhold``: one held package name a line.

    :returns: the names without ``:arch`` suffix, in input order, without duplicates.
    :raises: nothing.
    """
    names = []  # type: List[str]
    if not text:
        return names
    for raw in text.splitlines():
        word = raw.strip()
        if not word or " " in word:
            continue
        name = word.split(":", 1)[0]
        if name not in names:
            names.append(name)
    return names


def mark_held(packages: List[Dict[str, Any]], held_names: Iterable[str]) -> List[Dict[str, Any]]:
    """Set ``held: True`` on the packages named in ``held_names`` (e.g. from
    :func:`parse_apt_mark_showhold`); other records are left as they are.

    :returns: the same list, updated in place, for chaining.
    :raises: nothing.
    """
    held = set(n.split(":", 1)[0] for n in held_names)
    for package in packages:
        if package.get("name") in held:
            package["held"] = True
    return packages


# Packages whose version is the userspace driver version, most authoritative first: the NVML
# library itself, then the compute libraries, then the driver metapackages and tools.
# Debian/CUDA-repo Debian: libnvidia-ml1, nvidia-driver-libs, nvidia-driver-cuda, libcuda1,
# nvidia-smi; Ubuntu: libnvidia-compute-<branch> / libnvidia-compute, nvidia-utils-<branch>,
# libnvidia-common-<branch> (field case 17); RHEL CUDA repo: libnvidia-ml, nvidia-driver-cuda-libs,
# nvidia-driver-cuda, nvidia-driver-libs; RPM Fusion: xorg-x11-drv-nvidia-cuda-libs.
_USERSPACE_PACKAGES = (
    re.compile(r"^libnvidia-ml1?$"),
    re.compile(r"^libnvidia-compute(?:-\d+)?(?:-server)?$"),
    re.compile(r"^nvidia-driver-cuda-libs$"),
    re.compile(r"^nvidia-driver-libs$"),
    re.compile(r"^nvidia-driver-cuda$"),
    re.compile(r"^xorg-x11-drv-nvidia-cuda-libs$"),
    re.compile(r"^libcuda1$"),
    re.compile(r"^nvidia-utils(?:-\d+)?(?:-server)?$"),
    re.compile(r"^nvidia-smi$"),
    re.compile(r"^libnvidia-common(?:-\d+)?(?:-server)?$"),
    re.compile(r"^nvidia-driver(?:-\d+)?(?:-open)?(?:-server)?(?:-open)?$"),
)


def userspace_version_from_packages(packages: Optional[List[Dict[str, Any]]]) -> Optional[str]:
    """Derive the userspace driver version from installed packages.

    The first installed package, in this order of authority, gives the version: ``libnvidia-ml1``
    (Debian) / ``libnvidia-ml`` (RHEL), ``libnvidia-compute[-<branch>]`` (Ubuntu),
    ``nvidia-driver-cuda-libs``, ``nvidia-driver-libs``, ``nvidia-driver-cuda``,
    ``xorg-x11-drv-nvidia-cuda-libs``, ``libcuda1``, ``nvidia-utils[-<branch>]``, ``nvidia-smi``,
    ``libnvidia-common[-<branch>]``, ``nvidia-driver[-<branch>][-open]``. The Debian revision and the rpm epoch/release are stripped
    (:func:`upstream_version`): ``580.126.20-1`` → ``580.126.20``, ``3:580.126.09-1.el9`` →
    ``580.126.09``.

    :param packages: records from :func:`parse_dpkg_l` / :func:`parse_rpm_qa`; records with
        ``installed: False`` (``rc``, ``un``) are ignored.
    :returns: the version, or ``None`` when no such package is installed.
    :raises: nothing.
    """
    installed = [p for p in (packages or []) if p.get("installed", True) and p.get("version")]
    for pattern in _USERSPACE_PACKAGES:
        for package in installed:
            if pattern.match(package.get("name", "")):
                version = upstream_version(package["version"])
                if version:
                    return version
    return None


def fabricmanager_version_from_packages(packages: Optional[List[Dict[str, Any]]]) -> Optional[str]:
    """Return the upstream version of the installed Fabric Manager package.

    Names: ``nvidia-fabricmanager`` (580 on), ``nvidia-fabricmanager-<branch>`` (up to 575),
    ``nvidia-fabric-manager`` (RHEL). It must equal the driver version exactly (field case 11).

    :returns: the version (``"580.126.09"``), or ``None`` when none is installed.
    :raises: nothing.
    """
    for package in packages or []:
        if not package.get("installed", True):
            continue
        if re.match(r"^nvidia-fabric-?manager(?:-\d+)?$", package.get("name", "")):
            return upstream_version(package.get("version"))
    return None


# ---------------------------------------------------------------------------------------------
# Error texts: nvidia-smi, kernel log, Fabric Manager
# ---------------------------------------------------------------------------------------------

# nvidia-smi prints these when nvmlInit fails (texts as printed by drivers 3xx-5xx).
_NVIDIA_SMI_ERRORS = (
    ("Driver/library version mismatch", NVML_LIB_RM_VERSION_MISMATCH),
    ("couldn't communicate with the NVIDIA driver", NVML_DRIVER_NOT_LOADED),
    ("couldn't find libnvidia-ml.so", NVML_LIBRARY_NOT_FOUND),
    ("Failed to initialize NVML: Insufficient Permissions", NVML_NO_PERMISSION),
    ("Failed to initialize NVML: Unknown Error", NVML_UNKNOWN),
    ("GPU is lost", NVML_GPU_IS_LOST),
)


def nvml_error_from_text(text: Optional[str]) -> Optional[str]:
    """Map an ``nvidia-smi`` failure message to the NVML error it reports.

    * ``Failed to initialize NVML: Driver/library version mismatch`` → ``"LibRmVersionMismatch"``
    * ``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver`` →
      ``"DriverNotLoaded"``
    * ``NVIDIA-SMI couldn't find libnvidia-ml.so library in your system`` → ``"LibraryNotFound"``
    * ``Failed to initialize NVML: Insufficient Permissions`` → ``"NoPermission"``
    * ``Failed to initialize NVML: Unknown Error`` → ``"Unknown"``
    * ``... GPU is lost ...`` → ``"GpuIsLost"``

    The names are pynvml's exception names without ``NVMLError_`` (NVML ``nvmlReturn_t``).

    :returns: the error name, or ``None`` when the text holds none of these messages.
    :raises: nothing.
    """
    if not text:
        return None
    lowered = text.lower()
    for needle, name in _NVIDIA_SMI_ERRORS:
        if needle.lower() in lowered:
            return name
    return None


def parse_nvidia_smi_error(text: Optional[str]) -> Dict[str, Optional[str]]:
    """Parse an ``nvidia-smi`` failure: the NVML error and, on a version mismatch, the library version.

    On a mismatch ``nvidia-smi`` adds ``NVML library version: 595.71``: the userspace NVML
    library's version shortened to ``<branch>.<minor>`` (the patch level is not printed), so it is
    *not* an exact driver version and is not compared with :func:`versions_match`.

    :returns: ``{"nvml_error": str|None (see :func:`nvml_error_from_text`),
        "nvml_library_version_short": str|None, "message": str|None (the first error line)}``.
    :raises: nothing.
    """
    result = {"nvml_error": None, "nvml_library_version_short": None, "message": None}
    if not text:
        return result
    result["nvml_error"] = nvml_error_from_text(text)
    short = re.search(r"NVML library version:\s*(" + _VERSION_IN_TEXT + ")", text)
    if short:
        result["nvml_library_version_short"] = short.group(1)
    for raw in text.splitlines():
        line = raw.strip()
        if line and nvml_error_from_text(line):
            result["message"] = line
            break
    return result


def parse_fabricmanager_log(text: Optional[str]) -> Dict[str, Any]:
    """Find Fabric Manager's driver version refusal in its log or ``systemctl status`` output.

    ``nv-fabricmanager`` refuses to start when its build differs from the loaded driver::

        fabric manager NVIDIA GPU driver interface version 590.48.01 don't match with driver
        version 580.126.09. Please update with matching NVIDIA driver package.

    Versions with two or three parts are accepted (``550.120``). The verdict is exact version
    equality (:func:`versions_match`): the same branch is not enough (530.30.02 vs 530.41.03 is
    refused).

    :param text: the log text, or ``None``.
    :returns: ``{"found": bool, "fm_interface_version": str|None, "driver_version": str|None,
        "matches": bool|None (``None`` when no such message), "message": str|None}`` for the
        last such message in the text.
    :raises: nothing.
    """
    result = {
        "found": False,
        "fm_interface_version": None,
        "driver_version": None,
        "matches": None,
        "message": None,
    }
    if not text:
        return result
    pattern = re.compile(
        r"driver interface version (" + _VERSION_IN_TEXT + r") don'?t match with driver version ("
        + _VERSION_IN_TEXT
        + r")"
    )
    last = None
    for match in pattern.finditer(re.sub(r"\s+", " ", text)):
        last = match
    if last is None:
        return result
    result["found"] = True
    result["fm_interface_version"] = last.group(1)
    result["driver_version"] = last.group(2)
    result["matches"] = versions_match(last.group(1), last.group(2))
    result["message"] = last.group(0)
    return result


# ---------------------------------------------------------------------------------------------
# apt history
# ---------------------------------------------------------------------------------------------

_HISTORY_ENTRY = re.compile(r"(\S+?) \(([^)]*)\)(?:, |$)")

_HISTORY_ACTIONS = {
    "Install": "installs",
    "Upgrade": "upgrades",
    "Downgrade": "downgrades",
    "Remove": "removes",
    "Purge": "purges",
    "Reinstall": "reinstalls",
}


def parse_apt_history(text: Optional[str]) -> List[Dict[str, Any]]:
    """Parse ``/var/log/apt/history.log`` into transactions.

    The log is paragraphs of ``Key: value`` lines separated by blank lines: ``Start-Date``,
    ``Commandline``, ``Requested-By`` (``user (uid)``), ``Install``/``Upgrade``/``Downgrade``/
    ``Remove``/``Purge``/``Reinstall`` (comma-separated ``name:arch (versions)`` entries),
    ``Error``, ``End-Date``. Upgrade and downgrade entries carry ``(old, new)``; install entries
    ``(version[, automatic])``; remove entries ``(version)``.

    :param text: the log text, or ``None``.
    :returns: a list of ``{"start": str|None ("2021-04-24 06:50:54", runs of spaces collapsed),
        "end": str|None, "commandline": str|None, "requested_by": str|None,
        "unattended": bool (the command line runs ``unattended-upgrade``), "error": str|None,
        "installs": [{"name", "architecture", "version", "automatic"}],
        "upgrades": [{"name", "architecture", "from", "to"}], "downgrades": [same],
        "removes": [{"name", "architecture", "version"}], "purges": [same],
        "reinstalls": [same]}`` in log order.
    :raises: nothing; unknown keys are ignored.
    """
    transactions = []  # type: List[Dict[str, Any]]
    if not text:
        return transactions
    current = None  # type: Optional[Dict[str, Any]]

    def new_transaction() -> Dict[str, Any]:
        record = {
            "start": None,
            "end": None,
            "commandline": None,
            "requested_by": None,
            "unattended": False,
            "error": None,
        }  # type: Dict[str, Any]
        for key in _HISTORY_ACTIONS.values():
            record[key] = []
        return record

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        match = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
        if not match:
            continue
        key, value = match.group(1), match.group(2).strip()
        if key == "Start-Date" or current is None:
            current = new_transaction()
            transactions.append(current)
        if key == "Start-Date":
            current["start"] = re.sub(r"\s+", " ", value)
        elif key == "End-Date":
            current["end"] = re.sub(r"\s+", " ", value)
        elif key == "Commandline":
            current["commandline"] = value
            current["unattended"] = "unattended-upgrade" in value
        elif key == "Requested-By":
            current["requested_by"] = value
        elif key == "Error":
            current["error"] = value
        elif key in _HISTORY_ACTIONS:
            bucket = current[_HISTORY_ACTIONS[key]]
            for entry in _HISTORY_ENTRY.finditer(value):
                name, _sep, arch = entry.group(1).partition(":")
                versions = [v.strip() for v in entry.group(2).split(",")]
                record = {"name": name, "architecture": arch or None}  # type: Dict[str, Any]
                if key in ("Upgrade", "Downgrade"):
                    record["from"] = versions[0] if versions else None
                    record["to"] = versions[1] if len(versions) > 1 else None
                elif key == "Install":
                    record["version"] = versions[0] if versions else None
                    record["automatic"] = "automatic" in versions[1:]
                else:
                    record["version"] = versions[0] if versions else None
                bucket.append(record)
    return transactions


def nvidia_packages_moved(transaction: Dict[str, Any]) -> List[Dict[str, Any]]:
    """List the NVIDIA driver packages an apt transaction installed, moved or removed.

    :param transaction: one record of :func:`parse_apt_history`.
    :returns: ``[{"name", "action" ("install"|"upgrade"|"downgrade"|"remove"|"purge"|"reinstall"),
        "from": str|None, "to": str|None, "from_upstream": str|None, "to_upstream": str|None}]``
        for packages that :func:`is_driver_package` accepts. ``from`` is ``None`` for an install,
        ``to`` is ``None`` for a removal. Field case 17: ``libnvidia-common-460`` upgraded
        ``460.56-0ubuntu0.20.04.1`` → ``460.73.01-0ubuntu0.20.04.1`` by ``unattended-upgrade``.
    :raises: nothing.
    """
    moved = []  # type: List[Dict[str, Any]]
    actions = (
        ("installs", "install"),
        ("upgrades", "upgrade"),
        ("downgrades", "downgrade"),
        ("removes", "remove"),
        ("purges", "purge"),
        ("reinstalls", "reinstall"),
    )
    for key, action in actions:
        for entry in transaction.get(key) or []:
            if not is_driver_package(entry["name"]):
                continue
            if action in ("upgrade", "downgrade"):
                before, after = entry.get("from"), entry.get("to")
            elif action in ("remove", "purge"):
                before, after = entry.get("version"), None
            elif action == "reinstall":
                before = after = entry.get("version")
            else:
                before, after = None, entry.get("version")
            moved.append(
                {
                    "name": entry["name"],
                    "action": action,
                    "from": before,
                    "to": after,
                    "from_upstream": upstream_version(before),
                    "to_upstream": upstream_version(after),
                }
            )
    return moved


# ---------------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------------


def _package_label(package: Dict[str, Any]) -> str:
    return "%s %s (%s)" % (package.get("name"), package.get("version") or "?", package.get("status"))


def _signature_reasons(evidence: Dict[str, Any], module_found: Optional[bool], kernel_text: str) -> List[str]:
    """Why a built module is not loaded when Secure Boot refused it (field case 33), with the remedy."""
    signer = evidence.get("module_signer")
    signer_text = ("signed by \"%s\"" % signer) if signer else "unsigned"
    remedy = (" A reboot into the same kernel will not fix it: enroll the signing key as a Machine Owner Key "
              "(mokutil --import, and trust it for modules where the kernel keeps MOKs out of its machine keyring), "
              "or install the distribution's or NVIDIA's signed precompiled modules, or boot a kernel that trusts "
              "the key.")
    if evidence.get("signature_rejected"):
        return ["The kernel refused the module's signature (%s) under Secure Boot: module signature not accepted."
                % signer_text + remedy]
    if evidence.get("secure_boot") and module_found:
        return ["Secure Boot is on and the module (%s) is built for %s but not loaded: the kernel most likely "
                "refused its signature (look for \"Loading of unsigned module is rejected\" or \"Key was rejected "
                "by service\")." % (signer_text, kernel_text) + remedy]
    return []


def driver_state(
    userspace_version: Optional[str],
    loaded_version: Optional[str],
    on_disk_version: Optional[str],
    packages: Optional[List[Dict[str, Any]]] = None,
    evidence: Optional[Dict[str, Any]] = None,
) -> Tuple[Optional[str], List[str]]:
    """Decide ``driver.state`` from the three versions, the packages and some evidence.

    States (design notes, "Facts" → ``driver``):

    * ``not_installed`` - no driver package, no userspace library, no module on disk for the
      running kernel, nothing loaded.
    * ``broken`` - checked first, whatever else holds: driver packages half-configured
      (dpkg state ``U``/``F``/``H``/``W``/``t`` or error flag ``R``); or the on-disk module
      differs from the userspace (a reboot loads the wrong module again - field case 23); or no
      module on disk for the running kernel while the driver is installed ("driver not built for
      the running kernel", an installation problem and not a GPU failure - field case 24); or NVML
      reports a library/module mismatch while the on-disk module equals the loaded one (the
      libraries are the odd ones out); or, on a live host, a module is loaded or on disk but no
      userspace driver is present at all.
    * ``not_loaded`` - installed, nothing loaded (e.g. NVML ``DriverNotLoaded``, no
      ``/sys/module/nvidia``).
    * ``reboot_pending`` - loaded ≠ userspace and on-disk == userspace: the next boot loads
      the right module. NVML ``LibRmVersionMismatch`` is evidence for it even when a version is
      unknown (field case 17).
    * ``ok`` - loaded == userspace (and on-disk == both).

    Unknown versions (``None``), decided conservatively:

    * On a live host (``evidence["live"]`` true, the default) a source that gave nothing means
      absent: no loaded version → not loaded; no userspace version and no NVML evidence →
      no userspace driver.
    * In a captured bundle (``evidence["live"]`` false) a missing file means unknown. When the
      verdict needs a fact that is unknown, the state is ``None`` (undetermined) and the reasons
      say what is missing; it is never ``ok``.
    * An unknown on-disk version (``modinfo`` not available) does not block ``ok`` or
      ``reboot_pending``; the reasons then say that the on-disk module was not checked. A
      rollout's verification compares ``on_disk_version`` with its target itself.
    * A version that differs is never guessed equal: ``"595.71"`` does not match ``"595.71.05"``.

    :param userspace_version: NVML ``nvmlSystemGetDriverVersion`` / ``nvidia-smi``
        ``<driver_version>`` / :func:`userspace_version_from_packages`, or ``None``.
    :param loaded_version: ``/sys/module/nvidia/version`` or ``/proc/driver/nvidia/version``, or
        ``None``.
    :param on_disk_version: ``modinfo -F version nvidia`` for the running kernel, or ``None``.
    :param packages: driver package records (:func:`parse_dpkg_l`, :func:`parse_rpm_qa`);
        ``None`` when no package list was read, ``[]`` when it was read and holds none.
    :param evidence: optional flags: ``nvml_error`` (``"LibRmVersionMismatch"``,
        ``"DriverNotLoaded"``, ``"LibraryNotFound"``, another pynvml error name, or ``None``),
        ``nvml_initialized`` (bool: NVML or ``nvidia-smi`` answered, which proves the loaded
        module has the library's version), ``module_loaded`` (bool|None:
        ``/sys/module/nvidia`` present), ``module_found_for_running_kernel`` (bool|None:
        ``modinfo`` found a module / said "Module nvidia not found"), ``userspace_present``
        (bool|None: ``libnvidia-ml.so.1`` or ``nvidia-smi`` found), ``running_kernel`` (str),
        ``module_present_for`` (list of kernel releases that have an ``nvidia.ko``),
        ``kernel_log_nvrm`` (bool: the kernel log holds ``NVRM:`` lines, so a module was loaded
        when they were written; only words the undetermined verdict),
        ``secure_boot`` (bool|None: ``mokutil --sb-state``), ``module_signer`` (str|None: ``modinfo``
        ``signer:``), ``signature_rejected`` (bool: the kernel log says the module's signature was
        refused; a ``not_loaded`` state then says so, and that a reboot will not fix it),
        ``live`` (bool, default ``True``; ``False`` for a captured bundle).
    :returns: ``(state, reasons)``: ``state`` is one of ``facts_model.DRIVER_STATES`` or
        ``None`` (undetermined: a captured bundle without the files the verdict needs, or a
        loaded module whose userspace version could not be read, e.g. NVML ``NoPermission`` in a
        container without driver packages); ``reasons`` is a list of plain sentences that name
        the versions.
    :raises: nothing.
    """
    evidence = evidence or {}
    live = evidence.get("live", True)
    nvml_error = evidence.get("nvml_error")
    running_kernel = evidence.get("running_kernel")
    kernel_text = ("the running kernel %s" % running_kernel) if running_kernel else "the running kernel"
    reasons = []  # type: List[str]

    userspace = upstream_version(userspace_version)
    loaded = upstream_version(loaded_version)
    on_disk = upstream_version(on_disk_version)

    installed = [p for p in (packages or []) if p.get("installed", True)]
    half = [p for p in installed if p.get("half_configured")]

    module_found = evidence.get("module_found_for_running_kernel")
    if on_disk is not None:
        module_found = True

    loaded_inferred = False
    if loaded is None and userspace is not None and evidence.get("nvml_initialized"):
        loaded = userspace
        loaded_inferred = True
        reasons.append(
            "NVML or nvidia-smi answered, so a kernel module that works with the libraries' version %s is loaded "
            "(its own version file was not read)." % userspace
        )

    # Userspace: True present, False absent, None unknown.
    userspace_present = None  # type: Optional[bool]
    if (
        userspace is not None
        or nvml_error in (NVML_LIB_RM_VERSION_MISMATCH, NVML_DRIVER_NOT_LOADED, NVML_NO_PERMISSION)
        or evidence.get("nvml_initialized")
        or evidence.get("userspace_present")
    ):
        userspace_present = True
    elif nvml_error == NVML_LIBRARY_NOT_FOUND or evidence.get("userspace_present") is False or live:
        userspace_present = False

    # Loaded module: True, False, None unknown.
    module_loaded = None  # type: Optional[bool]
    if loaded is not None or nvml_error == NVML_LIB_RM_VERSION_MISMATCH or evidence.get("module_loaded"):
        module_loaded = True
    elif nvml_error == NVML_DRIVER_NOT_LOADED or evidence.get("module_loaded") is False or live:
        module_loaded = False

    packages_known = packages is not None
    something_installed = bool(installed) or userspace_present is True or module_found is True

    # --- not installed ----------------------------------------------------------------------
    if not something_installed and module_loaded is not True:
        unknown = []
        if not packages_known:
            unknown.append("the package list")
        if userspace_present is None:
            unknown.append("the userspace libraries (NVML / nvidia-smi)")
        if module_found is None and not live:
            unknown.append("the kernel module on disk (modinfo)")
        if module_loaded is None:
            unknown.append("the loaded kernel module")
        if unknown:
            seen = ""
            if evidence.get("kernel_log_nvrm"):
                seen = ("The kernel log holds NVRM lines, so an NVIDIA kernel module was loaded when "
                        "they were written. ")
            return None, reasons + [
                "%sThe driver state is undetermined: %s could not be checked."
                % (seen, ", ".join(unknown))
            ]
        return "not_installed", reasons + [
            "No NVIDIA driver is installed: no driver package, no NVML library, no nvidia kernel "
            "module on disk for %s and none loaded." % kernel_text
        ]

    # --- broken -----------------------------------------------------------------------------
    broken = []  # type: List[str]
    if half:
        broken.append(
            "Driver packages are not fully installed or configured: %s; a package transaction "
            "did not finish." % ", ".join(_package_label(p) for p in half)
        )
    if on_disk is not None and userspace is not None and not versions_match(on_disk, userspace):
        broken.append(
            "The kernel module on disk for %s is %s but the userspace driver is %s: the module that "
            "loads at every boot does not match the libraries, so a reboot will not fix it; rebuild "
            "or reinstall the kernel module." % (kernel_text, on_disk, userspace)
        )
    if module_found is False and (installed or userspace_present is True):
        present_for = evidence.get("module_present_for") or []
        sentence = (
            "The nvidia kernel module is not built for %s (modinfo: Module nvidia not found) "
            "although the driver is installed" % kernel_text
        )
        if userspace is not None:
            sentence += " (userspace %s)" % userspace
        if present_for:
            sentence += "; a module exists only for %s" % ", ".join(present_for)
        sentence += (
            ". This is an installation problem, not a GPU failure: build the module for this "
            "kernel (DKMS or the installer) or boot a kernel it was built for."
        )
        broken.append(sentence)
    if (
        nvml_error == NVML_LIB_RM_VERSION_MISMATCH
        and userspace is None
        and on_disk is not None
        and loaded is not None
        and versions_match(on_disk, loaded)
    ):
        broken.append(
            "NVML reports a driver/library version mismatch, yet the on-disk module %s equals the "
            "loaded module: the userspace libraries are the odd ones out and a reboot will not fix "
            "it." % on_disk
        )
    if userspace_present is False and (module_loaded is True or module_found is True):
        where = "loaded" if module_loaded is True else "on disk for %s" % kernel_text
        version = loaded if module_loaded is True else on_disk
        broken.append(
            "The nvidia kernel module %s is %s but no NVIDIA userspace driver was found (no NVML "
            "library, no nvidia-smi, no driver package)." % (version or "(version unknown)", where)
        )
    if broken:
        return "broken", reasons + broken

    # --- not loaded -------------------------------------------------------------------------
    if module_loaded is False:
        sentence = "No nvidia kernel module is loaded"
        if nvml_error == NVML_DRIVER_NOT_LOADED:
            sentence += " (NVML: DriverNotLoaded)"
        parts = []
        if userspace is not None:
            parts.append("userspace %s" % userspace)
        if on_disk is not None:
            parts.append("on disk %s" % on_disk)
        if parts:
            sentence += "; installed: %s" % ", ".join(parts)
        return "not_loaded", reasons + [sentence + "."] + _signature_reasons(evidence, module_found, kernel_text)
    if module_loaded is None:
        return None, reasons + [
            "Whether a kernel module is loaded is unknown (no /sys/module/nvidia/version or "
            "/proc/driver/nvidia/version, no NVML answer); the state is undetermined."
        ]

    # --- loaded -----------------------------------------------------------------------------
    on_disk_note = (
        " The on-disk module for %s was not checked (no modinfo)." % kernel_text
        if on_disk is None
        else ""
    )
    if loaded is not None and userspace is not None:
        if versions_match(loaded, userspace):
            if nvml_error == NVML_LIB_RM_VERSION_MISMATCH:
                reasons.append(
                    "NVML reported a driver/library version mismatch although the versions read "
                    "agree; the sources were read at different times."
                )
            if on_disk is not None:
                return "ok", reasons + [
                    "Userspace, loaded and on-disk driver versions agree: %s." % loaded
                ]
            if loaded_inferred:
                return "ok", reasons + [
                    "The userspace driver is %s and NVML works with the loaded module.%s"
                    % (loaded, on_disk_note)
                ]
            return "ok", reasons + [
                "Userspace and loaded driver versions agree: %s.%s" % (loaded, on_disk_note)
            ]
        sentence = (
            "The loaded kernel module is %s but the userspace driver is %s" % (loaded, userspace)
        )
        if nvml_error == NVML_LIB_RM_VERSION_MISMATCH:
            sentence += " (NVML: driver/library version mismatch)"
        if on_disk is not None:
            sentence += "; the on-disk module is %s, so a reboot loads the matching module." % on_disk
        else:
            sentence += "; a reboot is expected to load the matching module.%s" % on_disk_note
        return "reboot_pending", reasons + [sentence]

    if nvml_error == NVML_LIB_RM_VERSION_MISMATCH:
        sentence = "NVML reports a driver/library version mismatch: the loaded kernel module"
        if loaded is not None:
            sentence += " (%s)" % loaded
        sentence += " differs from the userspace libraries"
        if userspace is not None:
            sentence += " (%s)" % userspace
        if on_disk is not None:
            sentence += "; the on-disk module is %s" % on_disk
        sentence += "; a reboot (or module reload) is pending."
        if on_disk is None:
            sentence += on_disk_note
        return "reboot_pending", reasons + [sentence]

    # Loaded, userspace present but its version unknown.
    if loaded is not None and on_disk is not None and not versions_match(loaded, on_disk):
        return "reboot_pending", reasons + [
            "The loaded kernel module is %s but the on-disk module for %s is %s; the userspace "
            "version is unknown. A reboot loads %s." % (loaded, kernel_text, on_disk, on_disk)
        ]
    return None, reasons + [
        "A kernel module%s is loaded but the userspace driver version is unknown; the state is "
        "undetermined." % ((" " + loaded) if loaded else "")
    ]
