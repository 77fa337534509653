# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver role's apt repository in one module run, against files under a temporary directory.

``apt-get update`` is a recording stand-in (the module's ``run_command``): this is not an
integration test; tests/integration/test_driver_role.py configures the repository on booted nodes.
"""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.nvidia.plugins.modules import driver_apt_repository

KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQINBGJ\n-----END PGP PUBLIC KEY BLOCK-----\n"
SOURCES = "deb [signed-by=/k] https://user:secret@mirror.example/repo/ /\n"


@pytest.fixture(name="node")
def fixture_node(tmp_path, monkeypatch):
    calls = []
    lists = tmp_path / "lists"
    lists.mkdir()
    monkeypatch.setattr(driver_apt_repository, "UPDATE_STAMPS", (str(tmp_path / "stamp"), str(lists)))

    def run_command(self, argv, **kwargs):  # pylint: disable=unused-argument
        calls.append(list(argv))
        os.utime(str(lists))
        return 0, "", ""

    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    return tmp_path, calls, lists


def run(tmp_path, capsys, check=False, **extra):
    args = dict({"keyring_path": str(tmp_path / "keyrings" / "nvidia.asc"), "key": KEY,
                 "sources_path": str(tmp_path / "nvidia.list"), "sources_content": SOURCES},
                **extra)
    with patch_module_args(dict(args, _ansible_check_mode=check, _ansible_diff=True)):
        with pytest.raises(SystemExit) as exit_info:
            driver_apt_repository.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)


def test_check_mode_writes_nothing_then_the_files_are_written_once_and_the_lists_refreshed(node, capsys):
    tmp_path, calls, lists = node
    code, result = run(tmp_path, capsys, check=True)
    assert code == 0 and result["changed"] is True and result["key_changed"] is True
    assert result["cache_updated"] is False and calls == []
    assert not (tmp_path / "keyrings").exists()
    code, result = run(tmp_path, capsys)
    assert code == 0 and result["changed"] is True and result["cache_updated"] is True
    assert calls == [["apt-get", "update"]]
    assert (tmp_path / "keyrings" / "nvidia.asc").read_text() == KEY
    assert oct((tmp_path / "keyrings").stat().st_mode & 0o777) == "0o755"
    assert oct((tmp_path / "nvidia.list").stat().st_mode & 0o777) == "0o644"
    assert "secret" not in json.dumps(result)  # the sources entry is never logged
    # Again: nothing differs and the lists are fresh: no write, no refresh.
    code, result = run(tmp_path, capsys)
    assert code == 0 and result["changed"] is False and result["cache_updated"] is False
    assert len(calls) == 1
    # Lists older than cache_valid_time are refreshed, and that alone is no change.
    os.utime(str(lists), (1, 1))
    code, result = run(tmp_path, capsys)
    assert result["cache_updated"] is True and result["changed"] is False and len(calls) == 2


def test_a_failing_update_fails_naming_it(node, capsys, monkeypatch):
    tmp_path, _calls, _lists = node
    monkeypatch.setattr(AnsibleModule, "run_command", lambda self, argv, **kw: (100, "", "E: The repository is not signed."))
    code, result = run(tmp_path, capsys)
    assert code == 1 and result["msg"].startswith("apt-get update failed (rc 100)")
    assert "The repository is not signed" in result["msg"]
