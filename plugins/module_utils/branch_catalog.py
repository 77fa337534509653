# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA driver branches: the catalog, its refresh from ``releases.json``, and resolution.

A *branch* is NVIDIA's major driver number (``"580"``); each has a class - New Feature
Branch (``nfb``), Production Branch (``pb``) or Long Term Support Branch (``ltsb``) - a
release date, an end of life, the GPU architectures it supports, the kernel module flavours
it ships and its known versions (source: NVIDIA Data Center Drivers documentation, see
:mod:`branch_data`).

:func:`resolve_driver` turns what an operator asks for (``driver_branch: ltsb``, ``"580"``,
or an exact ``driver_version``) into **one exact version** for one node, given the
architectures of that node's GPUs and, where known, the versions its repository offers. It
refuses - raising :class:`ResolutionError` with a message that names the node's GPUs and
the choices that would be accepted - end-of-life branches (unless allowed), branches that
dropped an architecture present on the node, open kernel modules before Turing, proprietary
modules on Blackwell and later or on branches that no longer ship them, and versions that
are not in the branch or not in the repository.

Everything here is pure: dictionaries in, dictionaries out; dates are passed in
(``today``); nothing reads a file, the clock or the network.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_data

BRANCH_CLASSES = ("nfb", "pb", "ltsb")
KERNEL_MODULE_TYPES = ("auto", "open", "proprietary")

CLASS_NAMES = {
    "nfb": "New Feature Branch",
    "pb": "Production Branch",
    "ltsb": "Long Term Support Branch",
}

# releases.json "type" values (lower-cased) → branch class. Seen: "production branch",
# "lts branch", "new feature branch" (source: releases.json).
RELEASES_JSON_TYPES = {
    "production branch": "pb",
    "lts branch": "ltsb",
    "long term support branch": "ltsb",
    "ltsb": "ltsb",
    "new feature branch": "nfb",
    "feature branch": "nfb",
    "nfb": "nfb",
    "pb": "pb",
}

_ARCH_ORDER = [entry["name"] for entry in branch_data.ARCHITECTURES]
_ARCH_DISPLAY = dict((entry["name"], entry["display"]) for entry in branch_data.ARCHITECTURES)
_ARCH_BY_NVML = dict((entry["nvml"], entry["name"]) for entry in branch_data.ARCHITECTURES)
_ARCH_ALIASES = {
    "ada lovelace": "ada",
    "ada": "ada",
    "nvidia ampere": "ampere",
    "nvidia ampere architecture": "ampere",
    "ampere": "ampere",
}

_VERSION = re.compile(r"^\d+(?:\.\d+){1,3}$")
_BRANCH = re.compile(r"^[rR]?(\d{3,4})$")


class ResolutionError(ValueError):
    """A driver request that cannot be honoured on this node.

    :ivar code: a short machine-readable reason: ``unknown_branch``, ``eol``,
        ``architecture_unsupported``, ``open_unsupported``, ``proprietary_unsupported``,
        ``flavour_conflict``, ``version_not_in_branch``, ``version_not_in_repository``,
        ``version_unknown``, ``no_branch``, ``no_version``, ``unknown_architecture``,
        ``bad_request``.
    :ivar allowed: the choices that would be accepted for this node (list of str).
    """

    def __init__(self, code: str, message: str, allowed: Optional[List[str]] = None):
        ValueError.__init__(self, message)
        self.code = code
        self.message = message
        self.allowed = list(allowed or [])


# ---------------------------------------------------------------------------------------------
# Versions, branches, architectures
# ---------------------------------------------------------------------------------------------


def version_key(version: str) -> Tuple[int, ...]:
    """Sort key of an NVIDIA driver version: ``"580.126.20"`` → ``(580, 126, 20)``.

    :param version: a dotted numeric driver version (2 to 4 parts).
    :returns: a tuple of ints.
    :raises ValueError: when ``version`` is not a dotted numeric version.
    """
    text = str(version).strip()
    if not _VERSION.match(text):
        raise ValueError("not an NVIDIA driver version: %r (expected e.g. 580.126.20)" % (version,))
    return tuple(int(part) for part in text.split("."))


def is_version(value: Any) -> bool:
    """Tell whether ``value`` is a dotted numeric driver version such as ``"580.126.20"``."""
    return value is not None and bool(_VERSION.match(str(value).strip()))


def parse_branch(value: Any) -> Optional[str]:
    """Normalise a branch number: ``"R580"``, ``"580"``, ``580`` → ``"580"``.

    :returns: the branch as a string of digits, or ``None`` when ``value`` is not a branch number
        (a class name such as ``"ltsb"`` is not a branch number).
    :raises: nothing.
    """
    if value is None or isinstance(value, bool):
        return None
    match = _BRANCH.match(str(value).strip())
    return match.group(1) if match else None


def branch_of_version(version: str) -> str:
    """The branch of a driver version: ``"580.126.20"`` → ``"580"``.

    :raises ValueError: when ``version`` is not a driver version.
    """
    return str(version_key(version)[0])


def normalize_architecture(value: Any) -> str:
    """Map a GPU architecture as the facts give it to the catalog's name.

    Accepts NVML's ``nvmlDeviceArchitecture_t`` integer (``9`` → ``"hopper"``, source nvml.h),
    the name nvidia-smi prints in ``<product_architecture>`` (``"Hopper"``, ``"Ada Lovelace"``,
    ``"Ampere"``) and the catalog names themselves.

    :returns: one of ``kepler``, ``maxwell``, ``pascal``, ``volta``, ``turing``, ``ampere``,
        ``ada``, ``hopper``, ``blackwell``, ``rubin``.
    :raises ValueError: for ``None``, an unknown name or an unknown NVML value.
    """
    if value is None or isinstance(value, bool):
        raise ValueError("GPU architecture is unknown")
    if isinstance(value, int):
        if value in _ARCH_BY_NVML:
            return _ARCH_BY_NVML[value]
        raise ValueError("unknown NVML architecture value %r" % (value,))
    text = re.sub(r"\s+", " ", str(value).strip().lower())
    if text.isdigit():
        return normalize_architecture(int(text))
    text = _ARCH_ALIASES.get(text, text)
    if text in _ARCH_ORDER:
        return text
    raise ValueError("unknown GPU architecture %r" % (value,))


def architecture_display(name: str) -> str:
    """The architecture's name as NVIDIA writes it: ``"ada"`` → ``"Ada Lovelace"``."""
    return _ARCH_DISPLAY.get(name, name)


def architecture_rank(name: str) -> int:
    """Position of an architecture in time (Kepler 0 ... Rubin 9); unknown names rank -1."""
    return _ARCH_ORDER.index(name) if name in _ARCH_ORDER else -1


def _date_parts(value: str) -> Tuple[int, int, Optional[int]]:
    match = re.match(r"^(\d{4})-(\d{2})(?:-(\d{2}))?", str(value).strip())
    if not match:
        raise ValueError("not a date: %r (expected YYYY-MM or YYYY-MM-DD)" % (value,))
    day = int(match.group(3)) if match.group(3) else None
    return int(match.group(1)), int(match.group(2)), day


def date_passed(limit: Optional[str], today: str) -> bool:
    """Tell whether ``today`` is after ``limit``.

    :param limit: ``"YYYY-MM"`` (the whole month is still within the limit) or ``"YYYY-MM-DD"``;
        ``None`` never passes.
    :param today: ``"YYYY-MM-DD"``.
    :raises ValueError: on dates of another form.
    """
    if not limit:
        return False
    ly, lm, ld = _date_parts(limit)
    ty, tm, td = _date_parts(today)
    if ld is None:
        return (ty, tm) > (ly, lm)
    return (ty, tm, td or 1) > (ly, lm, ld)


# ---------------------------------------------------------------------------------------------
# The catalog
# ---------------------------------------------------------------------------------------------


def get_catalog() -> Dict[str, Any]:
    """Return a copy of the built-in catalog.

    :returns: ``{"as_of": "YYYY-MM-DD", "sources": {key: text}, "branches": {branch: {"class",
        "released", "eol", "max_cuda_major", "architectures", "kernel_module_types", "versions"
        (sorted oldest first), "sources", "last_for"?}}, "refreshed_from": None}``.
    :raises: nothing.
    """
    branches = copy.deepcopy(branch_data.BRANCHES)
    for info in branches.values():
        info["versions"] = sorted(set(info.get("versions") or []), key=version_key)
    return {
        "as_of": branch_data.AS_OF,
        "sources": dict(branch_data.SOURCES),
        "branches": branches,
        "refreshed_from": None,
    }


def _inherit_capabilities(branches: Dict[str, Any], branch: str) -> Dict[str, Any]:
    """Capabilities for a branch the built-in data does not know: those of the nearest older one."""
    older = [b for b in branches if int(b) < int(branch)]
    if not older:
        return {"architectures": list(_ARCH_ORDER[_ARCH_ORDER.index("turing"):]),
                "kernel_module_types": ["open"], "max_cuda_major": None}
    base = branches[max(older, key=int)]
    return {
        "architectures": list(base.get("architectures") or []),
        "kernel_module_types": list(base.get("kernel_module_types") or []),
        "max_cuda_major": base.get("max_cuda_major"),
    }


def refresh_from_releases(releases: Any, catalog: Optional[Dict[str, Any]] = None,
                          retrieved: Optional[str] = None, source: Optional[str] = None) -> Dict[str, Any]:
    """Merge a copy of NVIDIA's ``releases.json`` into a catalog.

    Shape of ``releases.json`` (source: ``https://docs.nvidia.com/datacenter/tesla/drivers/releases.json``,
    documented for automation on the "Supported Drivers and CUDA Toolkit Versions" page)::

        {"580": {"type": "lts branch",
                 "driver_info": [{"release_version": "580.105.08", "release_date": "2025-11-04",
                                  "release_notes": "https://...", "architectures": ["x86_64", ...],
                                  "runfile_url": {"x86_64": "https://..."}}, ...newest first]},
         "595": {"type": "production branch", ...}, "590": {"type": "new feature branch", ...}}

    What is taken: the class (``type``), every ``release_version`` that belongs to the branch,
    and the earliest dated release as ``released`` when the catalog has none. What is kept from
    the catalog: end of life, GPU architectures, kernel module flavours and CUDA major, which
    ``releases.json`` does not carry. A branch the catalog does not know inherits the
    capabilities of the nearest older branch and is marked ``"inferred": True``.

    :param releases: the parsed document (``dict``) or its JSON text.
    :param catalog: the catalog to refresh (default: :func:`get_catalog`); not modified.
    :param retrieved: ``"YYYY-MM-DD"`` the copy was taken; becomes ``as_of`` when newer.
    :param source: where the copy came from (a path or URL), recorded in ``refreshed_from``.
    :returns: a new catalog (see :func:`get_catalog`) with ``refreshed_from`` set and, per
        branch touched, ``"releases_json": True``.
    :raises ValueError: when the document is not an object keyed by branch, or holds no branch.
    """
    if isinstance(releases, (bytes, bytearray)):
        releases = releases.decode("utf-8")
    if isinstance(releases, str):
        try:
            releases = json.loads(releases)
        except ValueError as exc:
            raise ValueError("releases.json is not valid JSON: %s" % exc)
    if not isinstance(releases, dict):
        raise ValueError("releases.json: expected an object keyed by branch, got %s" % type(releases).__name__)
    result = copy.deepcopy(catalog) if catalog is not None else get_catalog()
    branches = result["branches"]
    seen = 0
    for key, info in releases.items():
        branch = parse_branch(key)
        if branch is None or not isinstance(info, dict):
            continue
        branch_class = RELEASES_JSON_TYPES.get(str(info.get("type") or "").strip().lower())
        versions = []
        dates = []
        for entry in info.get("driver_info") or []:
            if not isinstance(entry, dict):
                continue
            version = str(entry.get("release_version") or "").strip()
            if not is_version(version) or branch_of_version(version) != branch:
                continue
            versions.append(version)
            date = str(entry.get("release_date") or "").strip()
            if re.match(r"^\d{4}-\d{2}-\d{2}$", date):
                dates.append(date)
        if not versions and branch_class is None:
            continue
        seen += 1
        if branch not in branches:
            entry = {
                "class": branch_class or "nfb",
                "released": min(dates) if dates else None,
                "eol": None,
                "versions": [],
                "sources": ["releases-json"],
                "inferred": True,
            }
            entry.update(_inherit_capabilities(branches, branch))
            branches[branch] = entry
        target = branches[branch]
        if branch_class:
            target["class"] = branch_class
        target["versions"] = sorted(set(target.get("versions") or []) | set(versions), key=version_key)
        if dates and not target.get("released"):
            target["released"] = min(dates)
        if "releases-json" not in target.setdefault("sources", []):
            target["sources"].append("releases-json")
        target["releases_json"] = True
    if not seen:
        raise ValueError("releases.json holds no driver branch")
    if retrieved and re.match(r"^\d{4}-\d{2}-\d{2}$", retrieved) and retrieved > (result.get("as_of") or ""):
        result["as_of"] = retrieved
    result["refreshed_from"] = source or "releases.json"
    return result


def branch_info(catalog: Dict[str, Any], branch: Any) -> Dict[str, Any]:
    """The catalog entry of one branch.

    :raises ResolutionError: ``unknown_branch`` when the catalog does not know the branch.
    """
    name = parse_branch(branch)
    if name is None or name not in catalog["branches"]:
        raise ResolutionError(
            "unknown_branch",
            "driver branch %r is not in the catalog (as of %s); known branches: %s"
            % (branch, catalog.get("as_of"), ", ".join(sorted(catalog["branches"], key=int))),
            sorted(catalog["branches"], key=int),
        )
    return catalog["branches"][name]


def eol_status(catalog: Dict[str, Any], branch: Any, today: str) -> Dict[str, Any]:
    """End-of-life status of a branch on a date.

    A branch is end of life after its published end-of-life month or day. A New Feature Branch
    without a published date is treated as end of life once a newer New Feature Branch exists
    (NVIDIA: NFBs are short-lived and have no end-of-life date; source "dc-drivers-lifecycle").

    :param today: ``"YYYY-MM-DD"``.
    :returns: ``{"eol": bool, "eol_date": str|None, "superseded_by": str|None, "reason": str|None}``.
    :raises ResolutionError: ``unknown_branch``.
    """
    info = branch_info(catalog, branch)
    name = parse_branch(branch)
    status = {"eol": False, "eol_date": info.get("eol"), "superseded_by": None, "reason": None}
    if info.get("eol"):
        if date_passed(info["eol"], today):
            status["eol"] = True
            status["reason"] = "end of life since %s" % info["eol"]
        return status
    if info.get("class") == "nfb":
        newer = sorted(
            (b for b, i in catalog["branches"].items() if i.get("class") == "nfb" and int(b) > int(name)),
            key=int,
        )
        if newer:
            status["eol"] = True
            status["superseded_by"] = newer[0]
            status["reason"] = "New Feature Branch superseded by R%s" % newer[0]
    return status


# ---------------------------------------------------------------------------------------------
# GPUs of a node
# ---------------------------------------------------------------------------------------------


def node_architectures(gpus: Optional[Iterable[Any]] = None,
                       declared: Optional[Iterable[Any]] = None) -> Dict[str, Any]:
    """Collect the GPU architectures of a node from its facts and/or a declaration.

    :param gpus: ``ansible_facts.nvidia.gpus`` (dicts with ``architecture``, ``name``, ``index``)
        or bare architecture values. GPUs whose architecture is ``None`` are skipped (a node
        without a driver cannot read it).
    :param declared: architectures declared for the node's GPU class (``driver_gpu_architectures``),
        used when the facts give none.
    :returns: ``{"architectures": [names, oldest first], "gpus": [{"name", "architecture"}],
        "source": "facts"|"declared"|"none", "summary": "8× NVIDIA H100 80GB HBM3 (Hopper)"}``.
    :raises ResolutionError: ``unknown_architecture`` for a value that is not an architecture, and
        ``bad_request`` when facts and declaration disagree.
    """
    found = []  # type: List[Dict[str, Any]]
    for gpu in gpus or []:
        if isinstance(gpu, dict):
            raw = gpu.get("architecture")
            name = gpu.get("name")
        else:
            raw, name = gpu, None
        if raw is None or (isinstance(raw, str) and (not raw.strip() or raw.strip().lower().startswith("unknown"))):
            continue
        try:
            arch = normalize_architecture(raw)
        except ValueError as exc:
            raise ResolutionError("unknown_architecture", str(exc))
        found.append({"name": name, "architecture": arch})
    declared_archs = []  # type: List[str]
    for value in declared or []:
        try:
            declared_archs.append(normalize_architecture(value))
        except ValueError as exc:
            raise ResolutionError("unknown_architecture", "driver_gpu_architectures: %s" % exc)
    if found:
        archs = sorted(set(g["architecture"] for g in found), key=architecture_rank)
        if declared_archs and set(declared_archs) != set(archs):
            raise ResolutionError(
                "bad_request",
                "the GPUs found (%s) do not match driver_gpu_architectures %s; correct the declaration "
                "for this GPU class" % (summarize_gpus(found), sorted(set(declared_archs), key=architecture_rank)),
            )
        source = "facts"
        gpu_list = found
    elif declared_archs:
        archs = sorted(set(declared_archs), key=architecture_rank)
        source = "declared"
        gpu_list = [{"name": None, "architecture": a} for a in archs]
    else:
        archs, source, gpu_list = [], "none", []
    return {"architectures": archs, "gpus": gpu_list, "source": source, "summary": summarize_gpus(gpu_list)}


def summarize_gpus(gpus: Sequence[Dict[str, Any]]) -> str:
    """``[{"name": "Tesla V100-SXM2-32GB", "architecture": "volta"}] * 8`` → ``"8× Tesla V100-SXM2-32GB (Volta)"``.

    GPUs without a name (declared architectures) read ``"Volta GPUs (declared)"``.
    """
    if not gpus:
        return "no GPUs found"
    counts = {}  # type: Dict[Tuple[Any, str], int]
    order = []  # type: List[Tuple[Any, str]]
    for gpu in gpus:
        key = (gpu.get("name"), gpu.get("architecture"))
        if key not in counts:
            order.append(key)
            counts[key] = 0
        counts[key] += 1
    parts = []
    for name, arch in order:
        if name:
            parts.append("%d\u00d7 %s (%s)" % (counts[(name, arch)], name, architecture_display(arch)))
        else:
            parts.append("%s GPUs (declared)" % architecture_display(arch))
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Capabilities of a branch for a set of architectures
# ---------------------------------------------------------------------------------------------


def allowed_module_types(architectures: Sequence[str]) -> List[str]:
    """Kernel module flavours these GPU architectures can use, whatever the branch.

    Open modules need Turing or later; proprietary modules are not supported on Blackwell and
    later (source "open-modules-blog").

    :returns: a sub-list of ``["open", "proprietary"]`` (empty for a mix of pre-Turing and
        Blackwell GPUs, which no driver supports on one node).
    """
    first_open = architecture_rank(branch_data.OPEN_MODULES_FIRST_ARCHITECTURE)
    last_prop = architecture_rank(branch_data.PROPRIETARY_MODULES_LAST_ARCHITECTURE)
    ranks = [architecture_rank(a) for a in architectures]
    types = []
    if all(r >= first_open for r in ranks):
        types.append("open")
    if all(r <= last_prop for r in ranks):
        types.append("proprietary")
    return types


def _branch_problems(catalog: Dict[str, Any], branch: str, architectures: Sequence[str], today: str,
                     allow_eol: bool, module_type: str) -> List[Tuple[str, str]]:
    """Why a branch cannot serve these GPUs: a list of (code, text); empty when it can."""
    info = catalog["branches"][branch]
    problems = []
    status = eol_status(catalog, branch, today)
    if status["eol"] and not allow_eol:
        problems.append(("eol", "R%s is %s" % (branch, status["reason"])))
    missing = [a for a in architectures if a not in (info.get("architectures") or [])]
    if missing:
        problems.append(("architecture_unsupported", "R%s does not support %s"
                         % (branch, ", ".join(architecture_display(a) for a in missing))))
    flavours = _flavours_for(info, architectures)
    if module_type == "auto":
        if not flavours:
            problems.append(("flavour_conflict", "no kernel module flavour of R%s serves %s"
                             % (branch, ", ".join(architecture_display(a) for a in architectures))))
    elif module_type not in flavours:
        if module_type == "proprietary" and "proprietary" not in (info.get("kernel_module_types") or []):
            problems.append(("proprietary_unsupported", "R%s ships open kernel modules only" % branch))
        elif module_type == "proprietary":
            problems.append(("proprietary_unsupported", "proprietary kernel modules do not support %s"
                             % ", ".join(architecture_display(a) for a in architectures
                                         if architecture_rank(a) > architecture_rank(
                                             branch_data.PROPRIETARY_MODULES_LAST_ARCHITECTURE))))
        else:
            problems.append(("open_unsupported", "open kernel modules need Turing or later, not %s"
                             % ", ".join(architecture_display(a) for a in architectures
                                         if architecture_rank(a) < architecture_rank(
                                             branch_data.OPEN_MODULES_FIRST_ARCHITECTURE))))
    return problems


def _flavours_for(info: Dict[str, Any], architectures: Sequence[str]) -> List[str]:
    shipped = info.get("kernel_module_types") or []
    return [t for t in allowed_module_types(architectures) if t in shipped]


def choose_module_type(info: Dict[str, Any], architectures: Sequence[str], requested: str = "auto") -> str:
    """The kernel module flavour to install: ``requested``, or for ``auto`` open when the GPUs
    allow it (NVIDIA's default since R560, source "open-modules-blog"), else proprietary.

    :raises ResolutionError: when the flavour is not possible (see :func:`resolve_driver`).
    """
    flavours = _flavours_for(info, architectures)
    if requested == "auto":
        if "open" in flavours:
            return "open"
        if "proprietary" in flavours:
            return "proprietary"
        raise ResolutionError("flavour_conflict", "no kernel module flavour serves these GPUs")
    if requested not in flavours:
        raise ResolutionError("%s_unsupported" % requested, "%s kernel modules are not possible here" % requested)
    return requested


def allowed_choices(catalog: Dict[str, Any], architectures: Sequence[str], today: str,
                    allow_eol: bool = False, module_type: str = "auto") -> List[str]:
    """The ``driver_branch`` values that would be accepted for these GPUs.

    :returns: e.g. ``["ltsb (R620)", "pb (R595)", "580", "595", "620"]``: each class with the
        branch it resolves to, then each acceptable branch number.
    """
    ok = [b for b in sorted(catalog["branches"], key=int)
          if not _branch_problems(catalog, b, architectures, today, allow_eol, module_type)]
    choices = []
    for cls in ("ltsb", "pb", "nfb"):
        of_class = [b for b in ok if catalog["branches"][b].get("class") == cls]
        if of_class:
            choices.append("%s (R%s)" % (cls, max(of_class, key=int)))
    choices.extend(ok)
    return choices


# ---------------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------------


def _refuse(code: str, reason: str, node: Optional[str], gpus_summary: str, choices: List[str],
            allow_eol: bool, extra: str = "") -> ResolutionError:
    who = "node %s" % node if node else "this node"
    text = "Refused for %s with %s: %s." % (who, gpus_summary, reason)
    if extra:
        text += " " + extra
    if choices:
        text += " Allowed driver_branch values for these GPUs: %s." % ", ".join(choices)
    else:
        hint = "" if allow_eol else " (driver_allow_eol: true would admit end-of-life branches)"
        text += " No branch in the catalog serves these GPUs%s." % hint
    return ResolutionError(code, text, choices)


def resolve_driver(catalog: Dict[str, Any], branch: Any = "ltsb", gpus: Optional[Iterable[Any]] = None,
                   today: Optional[str] = None, version: Optional[str] = None,
                   kernel_module_type: str = "auto", available_versions: Optional[Iterable[str]] = None,
                   allow_eol: bool = False, node: Optional[str] = None,
                   declared_architectures: Optional[Iterable[Any]] = None) -> Dict[str, Any]:
    """Resolve a driver request to one exact version for one node.

    Steps: collect the node's GPU architectures (:func:`node_architectures`); pick the branch
    (an explicit branch number, or for a class the newest branch of that class that is not end
    of life - unless ``allow_eol`` - supports every architecture present and can serve the
    kernel module flavour); pick the version (the requested one, which must belong to the
    branch and be in the repository; else the newest version of the branch in the repository,
    or, without repository information, the newest the catalog knows).

    :param catalog: from :func:`get_catalog` or :func:`refresh_from_releases`.
    :param branch: ``"nfb"``, ``"pb"``, ``"ltsb"``, or a branch number (``"580"``, ``"R580"``, 580).
    :param gpus: ``ansible_facts.nvidia.gpus`` or architecture values.
    :param today: ``"YYYY-MM-DD"``, the date end of life is judged on (default: the catalog's
        ``as_of``).
    :param version: an exact driver version (``"580.126.20"``), optional.
    :param kernel_module_type: ``auto``, ``open`` or ``proprietary``.
    :param available_versions: driver versions the node's repository offers (upstream versions,
        e.g. from ``apt-cache madison nvidia-driver``); ``None`` when unknown.
    :param allow_eol: admit end-of-life branches (``driver_allow_eol``).
    :param node: the node's name, for messages.
    :param declared_architectures: ``driver_gpu_architectures``, used when facts have no GPUs.
    :returns: ``{"branch", "branch_class", "version", "kernel_module_type", "eol", "eol_date",
        "max_cuda_major", "architectures", "gpus", "architecture_source", "version_source"
        ("request"|"repository"|"catalog"), "in_catalog", "warnings": [str], "catalog_as_of",
        "requested": {"branch", "version", "kernel_module_type"}}``.
    :raises ResolutionError: with ``code`` and a message naming the node's GPUs and the allowed
        choices (see the class).
    """
    today = today or catalog.get("as_of")
    kernel_module_type = (kernel_module_type or "auto").strip().lower()
    if kernel_module_type not in KERNEL_MODULE_TYPES:
        raise ResolutionError("bad_request", "driver_kernel_module_type must be one of %s, got %r"
                              % (", ".join(KERNEL_MODULE_TYPES), kernel_module_type))
    node_info = node_architectures(gpus, declared_architectures)
    archs = node_info["architectures"]
    summary = node_info["summary"]
    if not archs:
        raise ResolutionError(
            "unknown_architecture",
            "Refused for %s: the GPU architectures are unknown (no GPU facts and no driver_gpu_architectures); "
            "declare driver_gpu_architectures for this GPU class" % ("node %s" % node if node else "this node"),
        )
    for arch in archs:
        if not any(arch in (i.get("architectures") or []) for i in catalog["branches"].values()):
            raise _refuse("architecture_unsupported", "no branch in the catalog (as of %s) supports %s"
                          % (catalog.get("as_of"), architecture_display(arch)), node, summary, [], allow_eol)
    choices = allowed_choices(catalog, archs, today, allow_eol, kernel_module_type)
    if version is not None and str(version).strip() == "":
        version = None
    if version is not None and not is_version(version):
        raise ResolutionError("bad_request", "driver_version %r is not an NVIDIA driver version (e.g. 580.126.20)"
                              % (version,), choices)
    requested_class = str(branch).strip().lower() if branch is not None else None
    explicit = parse_branch(branch)
    if explicit is None and requested_class not in BRANCH_CLASSES:
        if version is not None and (branch is None or requested_class in ("", "none")):
            explicit = branch_of_version(version)
        else:
            raise ResolutionError("bad_request", "driver_branch must be nfb, pb, ltsb or a branch number such as "
                                  "580, got %r" % (branch,), choices)
    warnings = []  # type: List[str]
    avail = None
    if available_versions is not None:
        avail = sorted(set(str(v).strip() for v in available_versions if is_version(v)), key=version_key)

    if version is not None:
        vbranch = branch_of_version(version)
        if explicit is not None and vbranch != explicit:
            raise _refuse("version_not_in_branch", "driver_version %s is not in branch R%s" % (version, explicit),
                          node, summary, choices, allow_eol)
        if explicit is None:
            if vbranch not in catalog["branches"]:
                raise _refuse("unknown_branch", "driver_version %s belongs to R%s, which the catalog (as of %s) "
                              "does not know" % (version, vbranch, catalog.get("as_of")), node, summary,
                              choices, allow_eol)
            if catalog["branches"][vbranch].get("class") != requested_class:
                raise _refuse("version_not_in_branch", "driver_version %s belongs to R%s, a %s, not a %s"
                              % (version, vbranch, CLASS_NAMES.get(catalog["branches"][vbranch].get("class"), "?"),
                                 CLASS_NAMES[requested_class]), node, summary, choices, allow_eol)
        explicit = vbranch

    if explicit is not None:
        info = branch_info(catalog, explicit)
        problems = _branch_problems(catalog, explicit, archs, today, allow_eol, kernel_module_type)
        if problems:
            code, text = problems[0]
            extra = ""
            if code == "architecture_unsupported":
                last = [b for b, i in catalog["branches"].items()
                        if set(i.get("last_for") or []) & set(archs)]
                if last:
                    extra = "R%s is the last branch for %s." % (
                        last[0], ", ".join(architecture_display(a) for a in archs
                                           if a in catalog["branches"][last[0]].get("last_for", [])))
            if code == "eol":
                extra = "Set driver_allow_eol: true to install it anyway."
            raise _refuse(code, "; ".join(t for _c, t in problems), node, summary, choices, allow_eol, extra)
        chosen = explicit
    else:
        candidates = sorted((b for b, i in catalog["branches"].items() if i.get("class") == requested_class),
                            key=int, reverse=True)
        chosen = None
        rejected = []
        for cand in candidates:
            problems = _branch_problems(catalog, cand, archs, today, allow_eol, kernel_module_type)
            if problems:
                rejected.append("; ".join(t for _c, t in problems))
                continue
            versions = _branch_versions(catalog, cand, avail)
            if not versions:
                rejected.append("R%s has no version %s" % (cand, "in the repository" if avail is not None
                                                           else "in the catalog"))
                continue
            chosen = cand
            break
        if chosen is None:
            raise _refuse("no_branch", "no %s serves these GPUs (%s)" % (
                CLASS_NAMES[requested_class], "; ".join(rejected) or "none in the catalog"),
                node, summary, choices, allow_eol)
        info = catalog["branches"][chosen]

    module_type = choose_module_type(info, archs, kernel_module_type)
    status = eol_status(catalog, chosen, today)
    if status["eol"]:
        warnings.append("R%s is %s; installed because driver_allow_eol is set" % (chosen, status["reason"]))

    in_catalog = True
    if version is not None:
        if avail is not None and version not in avail:
            in_branch = [v for v in avail if branch_of_version(v) == chosen]
            raise _refuse("version_not_in_repository", "driver_version %s is not in the repository" % version,
                          node, summary, choices, allow_eol,
                          "The repository offers for R%s: %s." % (chosen, ", ".join(in_branch) or "nothing"))
        if version not in (info.get("versions") or []):
            in_catalog = False
            if avail is None:
                known = ", ".join(info.get("versions") or []) or "none"
                raise _refuse("version_unknown", "driver_version %s is neither in the catalog (as of %s) nor known "
                              "to be in the repository" % (version, catalog.get("as_of")), node, summary,
                              choices, allow_eol, "Known R%s versions: %s." % (chosen, known))
            warnings.append("%s is in the repository but not in the catalog (as of %s)"
                            % (version, catalog.get("as_of")))
        resolved = version
        version_source = "request"
    else:
        versions = _branch_versions(catalog, chosen, avail)
        if not versions:
            raise _refuse("no_version", "R%s has no version %s" % (
                chosen, "in the repository" if avail is not None else "in the catalog"),
                node, summary, choices, allow_eol)
        resolved = versions[-1]
        version_source = "repository" if avail is not None else "catalog"
        if resolved not in (info.get("versions") or []):
            in_catalog = False
            warnings.append("%s is in the repository but not in the catalog (as of %s)"
                            % (resolved, catalog.get("as_of")))
    return {
        "branch": chosen,
        "branch_class": info.get("class"),
        "version": resolved,
        "kernel_module_type": module_type,
        "eol": status["eol"],
        "eol_date": info.get("eol"),
        "max_cuda_major": info.get("max_cuda_major"),
        "architectures": archs,
        "gpus": summary,
        "architecture_source": node_info["source"],
        "version_source": version_source,
        "in_catalog": in_catalog,
        "warnings": warnings,
        "catalog_as_of": catalog.get("as_of"),
        "requested": {"branch": branch, "version": version, "kernel_module_type": kernel_module_type},
    }


def _branch_versions(catalog: Dict[str, Any], branch: str, avail: Optional[List[str]]) -> List[str]:
    if avail is not None:
        return [v for v in avail if branch_of_version(v) == branch]
    return list(catalog["branches"][branch].get("versions") or [])


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------


def _toolkit_key(text: str) -> Tuple[int, int, int]:
    parts = [int(p) for p in text.split(".")]
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def cuda_minimum_driver(toolkit: Any, mode: str = "toolkit") -> Dict[str, Any]:
    """Minimum Linux x86_64 driver for a CUDA toolkit version.

    ``mode="toolkit"``: the driver the toolkit release requires for its full feature set,
    from NVIDIA's table "CUDA Toolkit and Corresponding Driver Versions" (source
    "cuda-release-notes"): ``"13.0"`` → ``580.65.06``, ``"12.2.2"`` → ``535.104.05``. An update
    release not in the table takes the entry of the release it updates. ``mode="minor"``: CUDA
    minor version compatibility, the oldest branch that runs the toolkit with limited features
    (source "cuda-minor-compat"): 13.x → R580, 12.x → R525, 11.x → R450.

    :param toolkit: ``"13.0"``, ``"12.2.2"``, ``12.8``.
    :returns: ``{"toolkit": str, "mode": str, "minimum_driver": str (a version for "toolkit",
        a branch for "minor"), "label": str, "source": str}``.
    :raises ValueError: for a malformed toolkit version or one the table does not cover (newer
        than its newest entry, or older than CUDA 11.0).
    """
    text = str(toolkit).strip()
    if not re.match(r"^\d+\.\d+(?:\.\d+)?$", text):
        raise ValueError("not a CUDA toolkit version: %r (expected e.g. 12.8 or 13.0.1)" % (toolkit,))
    if mode == "minor":
        major = text.split(".", maxsplit=1)[0]
        if major not in branch_data.CUDA_MAJOR_MIN_BRANCH:
            raise ValueError("CUDA %s: minor version compatibility is documented for CUDA 11, 12 and 13 only" % text)
        return {"toolkit": text, "mode": "minor", "minimum_driver": branch_data.CUDA_MAJOR_MIN_BRANCH[major],
                "label": "CUDA %s.x" % major, "source": branch_data.SOURCES["cuda-minor-compat"]}
    if mode != "toolkit":
        raise ValueError("mode must be 'toolkit' or 'minor', got %r" % (mode,))
    key = _toolkit_key(text)
    table = branch_data.CUDA_TOOLKIT_MIN_DRIVER
    newest = _toolkit_key(table[0][0])
    if key[:2] > newest[:2]:
        raise ValueError("CUDA %s is newer than the table (newest: CUDA %s, as of %s); use mode='minor' for the "
                         "branch floor" % (text, table[0][0], branch_data.AS_OF))
    same_minor = [(tk, label, driver) for tk, label, driver in table if _toolkit_key(tk)[:2] == key[:2]]
    if not same_minor:
        raise ValueError("CUDA %s is not in the table of toolkit driver versions" % text)
    at_or_below = [row for row in same_minor if _toolkit_key(row[0]) <= key]
    tk, label, driver = at_or_below[0] if at_or_below else same_minor[-1]
    return {"toolkit": text, "mode": "toolkit", "minimum_driver": driver,
            "label": "CUDA %s %s" % (".".join(tk.split(".")[:2]), label),
            "source": branch_data.SOURCES["cuda-release-notes"]}


def driver_supports_cuda(driver_version: str, toolkit: Any) -> bool:
    """Tell whether a driver runs a CUDA toolkit's applications with the full feature set.

    :returns: ``version_key(driver_version) >= version_key(cuda_minimum_driver(toolkit))``.
    :raises ValueError: see :func:`cuda_minimum_driver` and :func:`version_key`.
    """
    need = cuda_minimum_driver(toolkit)["minimum_driver"]
    return version_key(driver_version) >= version_key(need)
