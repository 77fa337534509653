# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repository key's fingerprint read on the controller from the armored key file (no gpg)."""

from __future__ import annotations

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_repository import (
    check_signing_key,
    openpgp_primary_fingerprints,
)

# A throwaway key made for this test with gpg 2.2 (ed25519 primary, cv25519 subkey); gpg --show-keys gives
# the primary fingerprint below and the subkey's C2B703752E03A5908EA25561BDC8D482C71C308C.
KEY = """\
-----BEGIN PGP PUBLIC KEY BLOCK-----

mDMEaw+fZRYJKwYBBAHaRw8BAQdA0H9IcXVGJW4q5GzjLDbfhGzq09kPt/byxKSF
XUNZ6Su0KGdwdWZsZWV0IHRlc3Qga2V5IDx0ZXN0QGV4YW1wbGUuaW52YWxpZD6I
kAQTFggAOBYhBJ84MULZ4acI3+nXbmO7ezsTrSJRBQJrD59lAhsDBQsJCAcCBhUK
CQgLAgQWAgMBAh4BAheAAAoJEGO7ezsTrSJRe4sBAN0xLSqp0ufJggR8TKYSQ7Pw
/rbx9BhiXJjCN2gJWW2EAQDc/3mmRz2JgNXSDDCiLi1AddE+uJLcjyxrofK8L7vv
BLg4BGsPn2YSCisGAQQBl1UBBQEBB0AsLPjfbnZnhMAe2ZDdFVWflGvqz4a+a7Ja
360MzgBwLAMBCAeIeAQYFggAIBYhBJ84MULZ4acI3+nXbmO7ezsTrSJRBQJrD59m
AhsMAAoJEGO7ezsTrSJR+4QA/j2xlsIjQ69ZE+lnJ5aXaQwNEmkl0dBXVAQMyOru
EFL5AQDaqT4pYz2szwHzpwfSFyZgOz+9wxjeaRwOfmCk2mXqBA==
=6kcl
-----END PGP PUBLIC KEY BLOCK-----
"""
PRIMARY = "9F383142D9E1A708DFE9D76E63BB7B3B13AD2251"


def test_primary_fingerprint_only_not_the_subkey():
    assert openpgp_primary_fingerprints(KEY) == [PRIMARY]


def test_armored_key_checked_against_the_pin():
    assert check_signing_key(KEY, "9f38 3142 d9e1 a708 dfe9  d76e 63bb 7b3b 13ad 2251")["ok"] is True
    wrong = check_signing_key(KEY, "C2B703752E03A5908EA25561BDC8D482C71C308C")
    assert wrong["ok"] is False and wrong["found"] == [PRIMARY]
    assert "not the pinned C2B703752E03A5908EA25561BDC8D482C71C308C" in wrong["message"]


def test_two_keys_in_one_file_are_refused():
    both = check_signing_key(KEY + KEY, PRIMARY)
    assert both["ok"] is False and both["found"] == [PRIMARY, PRIMARY]


def test_text_that_is_not_a_key_has_no_fingerprint():
    assert openpgp_primary_fingerprints("<html>404</html>") == []
    assert openpgp_primary_fingerprints("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!\n") == []
