# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver's last known-good record in one module run, against a local facts file in a temporary directory.

The real record after a verified upgrade is tested on the simulated fleet (tests/integration).
"""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.nvidia.plugins.modules import driver_known_good

RECORDED = {"schema_version": 1, "current": {"version": "620.82.01", "branch": "620", "kernel_module_type": "open",
                                             "since": "2026-12-01T00:00:00Z"},
            "previous": {"version": "580.126.20", "branch": "580", "since": "t0"},
            "last_known_good": {"version": "580.126.20", "branch": "580", "since": "t0"}, "history": []}


def run(path, capsys, check=False, **args):
    with patch_module_args(dict(dict({"path": str(path)}, **args), _ansible_check_mode=check)):
        with pytest.raises(SystemExit) as exit_info:
            driver_known_good.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)


def test_the_loaded_healthy_installed_version_becomes_known_good_once(tmp_path, capsys):
    path = tmp_path / "gpufleet_driver.fact"
    path.write_text(json.dumps(RECORDED))
    code, result = run(path, capsys, check=True, loaded_version="620.82.01", driver_state="ok")
    assert code == 0 and result["changed"] is True
    assert json.loads(path.read_text()) == RECORDED  # check mode: nothing written
    code, result = run(path, capsys, loaded_version="620.82.01", driver_state="ok")
    written = json.loads(path.read_text())
    assert code == 0 and result["changed"] is True and written == result["local_facts"]
    assert written["last_known_good"]["version"] == "620.82.01" and written["last_known_good"]["branch"] == "620"
    assert written["current"] == RECORDED["current"] and written["previous"] == RECORDED["previous"]
    assert [(e["action"], e["to"]) for e in written["history"]] == [("known_good", "620.82.01")]
    code, result = run(path, capsys, loaded_version="620.82.01", driver_state="ok")
    assert code == 0 and result["changed"] is False


@pytest.mark.parametrize("loaded, state, why", [
    ("580.126.20", "ok", "state ok, loaded 580.126.20, installed 620.82.01"),
    ("620.82.01", "reboot_pending", "state reboot_pending, loaded 620.82.01, installed 620.82.01"),
    ("", "not_loaded", "state not_loaded, loaded none, installed 620.82.01"),
])
def test_a_driver_that_does_not_run_healthy_as_installed_is_not_marked(tmp_path, capsys, loaded, state, why):
    path = tmp_path / "gpufleet_driver.fact"
    path.write_text(json.dumps(RECORDED))
    code, result = run(path, capsys, loaded_version=loaded, driver_state=state)
    assert code == 1 and result["msg"] == "not marked known-good: " + why
    assert json.loads(path.read_text()) == RECORDED


def test_a_record_that_is_not_a_json_object_is_named(tmp_path, capsys):
    path = tmp_path / "gpufleet_driver.fact"
    path.write_text("{broken")
    code, result = run(path, capsys, loaded_version="620.82.01", driver_state="ok")
    assert code == 1 and result["msg"].startswith("not marked known-good: the driver's local facts %s are not JSON" % path)
