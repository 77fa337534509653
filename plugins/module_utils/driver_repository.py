# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver repository: NVIDIA's signing keys, their fingerprint check, and the repository files.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import re
from typing import Any, Dict, Iterable, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.distributions import package_manager


def normalize_fingerprint(value: Any) -> str:
    """``"a1b2 C3D4 ..."`` → ``"A1B2C3D4..."`` (upper case, no spaces or ``0x``)."""
    text = re.sub(r"\s+", "", str(value or "")).upper()
    return text[2:] if text.startswith("0X") else text


def gpg_primary_fingerprints(colons: Optional[str]) -> List[str]:
    """Primary-key fingerprints in ``gpg --show-keys --with-colons`` output (gpg(1), DETAILS:
    a ``pub`` record is followed by its ``fpr`` record, field 10 the fingerprint; ``sub``
    records and their ``fpr`` are subkeys and are skipped).

    :returns: upper-case fingerprints in file order.
    """
    found = []
    expect = False
    for line in (colons or "").splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            expect = True
        elif fields[0] == "sub":
            expect = False
        elif fields[0] == "fpr" and expect and len(fields) > 9:
            found.append(fields[9].upper())
            expect = False
    return found


def _armor_blocks(armored: str) -> List[bytes]:
    """The bytes of each ASCII-armored OpenPGP public key block in a text (RFC 4880 section 6.2: the
    BEGIN line, header lines, a blank line, base64 lines, then the ``=`` checksum line and the END line).

    :raises ValueError: a block without its blank line; :raises binascii.Error: bad base64.
    """
    lines = [line.strip() for line in armored.strip().splitlines()]
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("-----BEGIN PGP PUBLIC KEY BLOCK"):
            i += 1
            continue
        i += 1
        while i < len(lines) and lines[i]:
            i += 1
        if i >= len(lines):
            raise ValueError("armor without a blank line after its headers")
        body = []
        i += 1
        while i < len(lines) and not lines[i].startswith("-----END"):
            if not lines[i].startswith("="):
                body.append(lines[i])
            i += 1
        blocks.append(base64.b64decode("".join(body), validate=True))
    return blocks


def openpgp_primary_fingerprints(armored: Optional[str]) -> List[str]:
    """Primary-key fingerprints of an ASCII-armored OpenPGP public key file, read on the controller
    without gpg.

    Walks the packets (RFC 4880 section 4.2, old and new headers; RFC 9580 for version 6): a public
    key packet (tag 6) version 4 has fingerprint SHA-1 of ``0x99``, the two-byte body length and the
    body (RFC 4880 section 12.2); version 6, SHA-256 of ``0x9b``, the four-byte length and the body.
    Subkeys (tag 14) are skipped, as in :func:`gpg_primary_fingerprints`.

    :returns: upper-case fingerprints in file order; ``[]`` for text that is not an armored key.
    """
    try:
        data = b"".join(_armor_blocks(armored or ""))
    except (ValueError, binascii.Error):
        return []
    found = []
    pos = 0
    try:
        while pos < len(data):
            head = data[pos]
            if not head & 0x80:
                break
            if head & 0x40:
                tag = head & 0x3F
                first = data[pos + 1]
                if first < 192:
                    length, pos = first, pos + 2
                elif first < 224:
                    length, pos = ((first - 192) << 8) + data[pos + 2] + 192, pos + 3
                elif first == 255:
                    length, pos = struct.unpack(">I", data[pos + 2:pos + 6])[0], pos + 6
                else:
                    break  # partial lengths never occur in key packets
            else:
                tag = (head >> 2) & 0x0F
                size = {0: 1, 1: 2, 2: 4}.get(head & 0x03)
                if size is None:
                    break
                length = int.from_bytes(data[pos + 1:pos + 1 + size], "big")
                pos += 1 + size
            body = data[pos:pos + length]
            pos += length
            if tag == 6 and body[:1] == b"\x04":
                found.append(hashlib.sha1(b"\x99" + struct.pack(">H", len(body)) + body).hexdigest().upper())
            elif tag == 6 and body[:1] == b"\x06":
                found.append(hashlib.sha256(b"\x9b" + struct.pack(">I", len(body)) + body).hexdigest().upper())
    except (IndexError, struct.error):
        return []  # a truncated packet: not a key file gpg would read
    return found


def check_signing_key(colons: Optional[str], expected: Any) -> Dict[str, Any]:
    """Verify that a repository key file holds exactly the expected primary key.

    :param colons: ``gpg --show-keys --with-colons`` output for the key file, or the ASCII-armored
        key file itself (read by :func:`openpgp_primary_fingerprints`).
    :param expected: the fingerprint the operator pinned (``driver_apt_key_fingerprint``).
    :returns: ``{"ok": bool, "expected": str, "found": [str], "message": str}``; ``ok`` only when
        the file holds one primary key and it is the expected one (a file that adds other keys
        is refused too: it would widen trust).
    """
    want = normalize_fingerprint(expected)
    if "-----BEGIN PGP PUBLIC KEY BLOCK" in (colons or ""):
        found = openpgp_primary_fingerprints(colons)
    else:
        found = gpg_primary_fingerprints(colons)
    ok = bool(want) and found == [want]
    if ok:
        message = "repository key %s verified" % want
    elif not want:
        message = "no fingerprint pinned for the repository key (driver_apt_key_fingerprint)"
    elif want not in found:
        message = "the repository key has fingerprint %s, not the pinned %s" % (", ".join(found) or "none", want)
    else:
        message = "the repository key file holds more keys than the pinned one: %s" % ", ".join(found)
    return {"ok": ok, "expected": want, "found": found, "message": message}


NVIDIA_REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"


# NVIDIA CUDA repository signing keys (the key file in each repository directory and its
# fingerprint): Debian/Ubuntu ``3bf863cc.pub``, RHEL ``D42D0685.pub``. Sources: the repository
# directories, and public install scripts that pin them (docs/packages.md).
NVIDIA_REPO_KEYS = {
    "apt": {"file": "3bf863cc.pub", "fingerprint": "EB693B3035CD5710E231E123A4B469963BF863CC"},
    "dnf": {"file": "D42D0685.pub", "fingerprint": "610C7B14E068A878070DA4E99CD0A493D42D0685"},
}


APT_KEYRING_PATH = "/etc/apt/keyrings/gpufleet-nvidia-driver.asc"


APT_SOURCES_PATH = "/etc/apt/sources.list.d/gpufleet-nvidia-driver.list"


DNF_KEY_PATH = "/etc/pki/rpm-gpg/gpufleet-nvidia-driver.asc"


DNF_REPO_PATH = "/etc/yum.repos.d/gpufleet-nvidia-driver.repo"


DNF_REPO_ID = "gpufleet-nvidia-driver"


def repository_config(distribution: str, url: Optional[str] = None, fingerprint: Optional[str] = None,
                      arch: str = "x86_64", suite: str = "/", components: Optional[Iterable[str]] = None,
                      fingerprint_in_sources: bool = True) -> Dict[str, Any]:
    """The repository files the driver role writes, for NVIDIA's CUDA repository or a mirror.

    apt: a keyring file and one ``deb`` line whose ``signed-by`` names that keyring and, unless
    disabled, the pinned fingerprint (sources.list(5): signed-by takes keyring paths "and
    fingerprints of keys to select from these keyrings"), so that nothing but the pinned key can
    sign the repository; never ``trusted=yes``. dnf: a ``.repo`` file with ``gpgcheck=1`` and the
    key file.

    :param url: the repository (a mirror for air-gapped sites); default NVIDIA's
        ``https://developer.download.nvidia.com/compute/cuda/repos/<distribution>/<arch>/``.
    :param fingerprint: the pinned key fingerprint; default NVIDIA's key for the package manager.
    :returns: apt: ``{"package_manager": "apt", "url", "key_url", "fingerprint", "keyring_path",
        "sources_path", "sources_content", "suite", "components"}``; dnf: ``{"package_manager": "dnf",
        "url", "key_url", "fingerprint", "key_path", "repo_path", "repo_id", "repo_content"}``.
    """
    pm = package_manager(distribution)
    base = url or "%s/%s/%s/" % (NVIDIA_REPO_BASE, distribution, arch)
    if not base.endswith("/"):
        base += "/"
    key = NVIDIA_REPO_KEYS[pm]
    fpr = normalize_fingerprint(fingerprint or key["fingerprint"])
    key_url = base + key["file"]
    if pm == "apt":
        signed_by = APT_KEYRING_PATH + ("," + fpr if fingerprint_in_sources else "")
        comps = " ".join(components or [])
        line = ("deb [signed-by=%s] %s %s %s" % (signed_by, base, suite or "/", comps)).rstrip()
        return {
            "package_manager": "apt",
            "url": base,
            "key_url": key_url,
            "fingerprint": fpr,
            "keyring_path": APT_KEYRING_PATH,
            "sources_path": APT_SOURCES_PATH,
            "sources_content": "# Managed by gpufleet.nvidia (role driver)\n%s\n" % line,
            "suite": suite or "/",
            "components": list(components or []),
        }
    content = (
        "# Managed by gpufleet.nvidia (role driver)\n"
        "[%s]\n"
        "name=NVIDIA driver repository (gpufleet.nvidia)\n"
        "baseurl=%s\n"
        "enabled=1\n"
        "gpgcheck=1\n"
        "gpgkey=file://%s\n" % (DNF_REPO_ID, base, DNF_KEY_PATH)
    )
    return {
        "package_manager": "dnf",
        "url": base,
        "key_url": key_url,
        "fingerprint": fpr,
        "key_path": DNF_KEY_PATH,
        "repo_path": DNF_REPO_PATH,
        "repo_id": DNF_REPO_ID,
        "repo_content": content,
    }
