# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA driver branches: the catalog and its refresh from ``releases.json``.

A *branch* is NVIDIA's major driver number (``"580"``); each has a class - New Feature
Branch (``nfb``), Production Branch (``pb``) or Long Term Support Branch (``ltsb``) - a
release date, an end of life, the GPU architectures it supports, the kernel module flavours
it ships and its known versions (source: NVIDIA Data Center Drivers documentation, see
:mod:`branch_data`). Turning a request into one exact version for one node is
:mod:`driver_resolution`; version numbers are :mod:`driver_versions`; architectures are
:mod:`gpu_architectures`; CUDA is :mod:`cuda_compat`.

Everything here is pure: dictionaries in, dictionaries out; dates are passed in
(``today``); nothing reads a file, the clock or the network.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_data
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import (
    branch_of_version, is_version, parse_branch, version_key)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_architectures import ARCHITECTURE_NAMES

BRANCH_CLASSES = ("nfb", "pb", "ltsb")

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
        return {"architectures": list(ARCHITECTURE_NAMES[ARCHITECTURE_NAMES.index("turing"):]),
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
