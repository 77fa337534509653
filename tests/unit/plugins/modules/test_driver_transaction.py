# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the driver_transaction module's main() against a recording stand-in of a Debian node's dpkg and apt.

The stand-in keeps installed packages and holds and answers dpkg-query, apt-mark, apt-cache madison,
apt-get install and modinfo; the pin files are written under a temporary directory. The real
transaction on a booted node is tested in tests/integration/test_driver_role.py.
"""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.nvidia.plugins.module_utils import apt_plan
from ansible_collections.gpufleet.nvidia.plugins.modules import driver_transaction

DEB = ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "nvidia-kernel-support",
       "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-smi", "nvidia-persistenced"]
REPO_VERSIONS = ["580.126.20-1", "620.82.01-1"]
ARGS = {"branch": "620", "gpu_architectures": ["Hopper"], "distribution": "debian12", "today": "2026-11-29",
        "fabric_manager": "disabled", "repository": {"url": "http://127.0.0.1:8080/"}}
APT_CONFLICT = ("The following packages have unmet dependencies:\n"
                " nvidia-driver-cuda : Depends: nvidia-kernel-support (= 620.82.01-1) but 580.126.20-1 is to be installed\n"
                "E: Unable to correct problems, you have held broken packages.\n")


class FakeNode:
    """dpkg and apt of one node: ``installed`` {name: version}, ``held`` names, every command in ``calls``."""

    def __init__(self, installed=None, held=(), install_error=None, module_version=None):
        self.installed = dict(installed or {})
        self.held = set(held)
        self.install_error = install_error
        self.module_version = module_version
        self.enabled = set()
        self.calls = []

    def run_command(self, args, **kwargs):  # pylint: disable=unused-argument
        args = list(args)
        self.calls.append(args)
        if args[0] == "dpkg-query":
            return 0, "".join("ii  %s %s amd64\n" % item for item in sorted(self.installed.items())), ""
        if args[:2] == ["apt-mark", "showhold"]:
            return 0, "".join("%s\n" % n for n in sorted(self.held)), ""
        if args[:2] == ["apt-mark", "hold"]:
            self.held |= set(args[2:])
            return 0, "", ""
        if args[:2] == ["apt-mark", "unhold"]:
            self.held -= set(args[2:])
            return 0, "", ""
        if args[0] == "apt-cache":
            out = []
            for name in args[args.index("madison") + 1:]:
                if name in DEB:
                    out += ["%s | %s | http://127.0.0.1:8080 ./ Packages" % (name, v) for v in REPO_VERSIONS]
                elif name.startswith("nvidia-driver-pinning-"):
                    out.append("%s | %s-1 | http://127.0.0.1:8080 ./ Packages" % (name, name.rsplit("-", 1)[1]))
            return 0, "\n".join(out) + "\n", ""
        if args[:2] == ["apt-get", "install"]:
            if self.install_error:
                return 100, "", self.install_error
            for spec in args[2:]:
                if spec.startswith("-") or spec.startswith("Dpkg::"):
                    continue
                if spec.endswith("-"):
                    self.installed.pop(spec[:-1], None)
                elif "=" in spec:
                    name, version = spec.split("=", 1)
                    self.installed[name] = version
            return 0, "", ""
        if args[:2] == ["systemctl", "is-enabled"]:
            return (0, "enabled\n", "") if args[2] in self.enabled else (1, "disabled\n", "")
        if args[:2] == ["systemctl", "enable"]:
            self.enabled.add(args[2])
            return 0, "", ""
        if args[0] == "modinfo":
            return (0, self.module_version + "\n", "") if self.module_version else (1, "", "modinfo: ERROR")
        raise AssertionError("unexpected command %s" % args)


@pytest.fixture(name="paths")
def fixture_paths(tmp_path, monkeypatch):
    pin = tmp_path / "gpufleet-nvidia-driver"
    origin = tmp_path / "gpufleet-nvidia-origin"
    monkeypatch.setattr(apt_plan, "PREFERENCES_PATH", str(pin))
    monkeypatch.setattr(apt_plan, "ORIGIN_PREFERENCES_PATH", str(origin))
    monkeypatch.setattr(driver_transaction, "count_nvswitches", lambda: 0)
    return pin, origin


def run(node, args, capsys, monkeypatch, check=False, diff=False):
    monkeypatch.setattr(AnsibleModule, "run_command", lambda self, argv, **kw: node.run_command(argv, **kw))
    with patch_module_args(dict(args, _ansible_check_mode=check, _ansible_diff=diff)):
        with pytest.raises(SystemExit) as exit_info:
            driver_transaction.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)


def installed_580():
    names = [n for n in DEB if n != "nvidia-kernel-dkms"]
    return {n: "580.126.20-1" for n in names}


def test_check_mode_shows_the_transaction_and_changes_nothing(paths, capsys, monkeypatch):
    node = FakeNode()
    code, result = run(node, ARGS, capsys, monkeypatch, check=True, diff=True)
    assert code == 0 and result["changed"] is True
    assert "nvidia-driver-cuda=620.82.01-1" in result["plan"]["steps"][-2]["argv"]
    assert not [c for c in node.calls if c[0] == "apt-get" or c[:2] in (["apt-mark", "hold"], ["apt-mark", "unhold"])]
    assert node.installed == {} and not paths[0].exists() and not paths[1].exists()
    assert "package nvidia-driver-cuda 620.82.01-1" in result["diff"]["after"]
    assert "hold nvidia-driver-cuda" in result["diff"]["after"]
    assert "Pin: version 620.82.01-*" in result["diff"]["after"]
    assert "package " not in result["diff"]["before"]


def test_apply_installs_holds_pins_and_reads_back(paths, capsys, monkeypatch):
    node = FakeNode(module_version="620.82.01")
    code, result = run(node, ARGS, capsys, monkeypatch)
    assert code == 0 and result["changed"] is True, result
    wanted = {n for n in DEB if n != "nvidia-kernel-dkms"} | {"nvidia-driver-pinning-620"}
    assert set(node.installed) == wanted and node.held == wanted
    assert {v for n, v in node.installed.items() if n != "nvidia-driver-pinning-620"} == {"620.82.01-1"}
    assert "Pin: version 620.82.01-*\nPin-Priority: 1001" in paths[0].read_text()
    assert {p["name"]: p["version"] for p in result["installed_after"]} == node.installed
    assert ["modinfo", "-F", "version", "nvidia"] in node.calls

    again = FakeNode(installed=node.installed, held=node.held)
    code, result = run(again, ARGS, capsys, monkeypatch)
    assert code == 0 and result["changed"] is False and result["plan"]["steps"] == []
    assert not [c for c in again.calls if c[0] in ("apt-get", "modinfo")]


def test_upgrade_failure_restores_pin_and_holds_and_says_what_to_do(paths, capsys, monkeypatch):
    paths[0].write_text("previous pin\n")
    held = set(installed_580())
    node = FakeNode(installed=installed_580(), held=held, install_error=APT_CONFLICT)
    code, result = run(node, ARGS, capsys, monkeypatch)
    assert code == 1 and result["failed"] is True
    assert result["failed_step"]["name"] == "install the driver set"
    assert result["classified"]["kind"] == "dependency_conflict"
    assert "Wanted R620 620.82.01 (open kernel modules); found 580.126.20 installed" in result["msg"]
    assert "To do: make the repository offer the whole set" in result["msg"]
    assert paths[0].read_text() == "previous pin\n"
    assert node.held == held


def test_module_built_for_another_version_fails_before_any_reboot(paths, capsys, monkeypatch):
    node = FakeNode(module_version="580.126.20")
    code, result = run(node, ARGS, capsys, monkeypatch)
    assert code == 1 and result["module_build"]["verdict"] == "broken"
    assert "is 580.126.20 but the driver installed is 620.82.01" in result["msg"]


def test_the_local_facts_are_recorded_in_the_same_run_and_the_loaded_version_becomes_known_good(
        paths, capsys, monkeypatch, tmp_path):
    facts = tmp_path / "facts.d" / "gpufleet_driver.fact"
    facts.parent.mkdir()
    facts.write_text(json.dumps({"schema_version": 1, "current": {"version": "580.126.20", "branch": "580",
                                                                  "kernel_module_type": "open", "since": "t0"},
                                 "previous": None, "last_known_good": None, "history": []}))
    node = FakeNode(installed=installed_580(), held=set(installed_580()), module_version="620.82.01")
    options = {"path": str(facts), "loaded_version": "580.126.20", "driver_state": "ok", "mark_known_good": True}
    code, result = run(node, dict(ARGS, local_facts=options), capsys, monkeypatch, check=True, diff=True)
    assert code == 0 and result["action"] == "branch_change"
    assert result["local_facts"]["current"]["version"] == "620.82.01"
    assert json.loads(facts.read_text())["current"]["version"] == "580.126.20"  # check mode: not written
    assert '"version": "620.82.01"' in result["diff"]["after"] and "file %s:" % facts in result["diff"]["before"]
    code, result = run(node, dict(ARGS, local_facts=options), capsys, monkeypatch)
    assert code == 0 and result["changed"] is True
    written = json.loads(facts.read_text())
    assert written == result["local_facts"]
    assert written["current"]["version"] == "620.82.01" and written["previous"]["version"] == "580.126.20"
    assert written["last_known_good"]["version"] == "580.126.20"  # loaded, healthy and the recorded one
    assert [entry["action"] for entry in written["history"]] == ["branch_change"]
    assert oct(facts.stat().st_mode & 0o777) == "0o644"
    # Nothing new: the file is not written again and nothing changed.
    stamp = facts.stat().st_mtime_ns
    again = FakeNode(installed=node.installed, held=node.held)
    code, result = run(again, dict(ARGS, local_facts=dict(options, loaded_version="580.126.20")), capsys, monkeypatch)
    assert code == 0 and result["changed"] is False and result["action"] == "none"
    assert facts.stat().st_mtime_ns == stamp


def test_local_facts_that_are_not_a_json_object_fail_before_anything_is_changed(paths, capsys, monkeypatch, tmp_path):
    facts = tmp_path / "gpufleet_driver.fact"
    facts.write_text("[1, 2]")
    node = FakeNode(installed=installed_580(), held=set(installed_580()))
    code, result = run(node, dict(ARGS, local_facts={"path": str(facts)}), capsys, monkeypatch)
    assert code == 1 and "are not a JSON object (list)" in result["msg"] and "nothing was changed" in result["msg"]
    assert not [c for c in node.calls if c[0] in ("apt-get", "dpkg-query")]
    assert node.installed == installed_580()


def test_services_are_enabled_where_their_units_are_installed(paths, capsys, monkeypatch, tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    (units / "nvidia-persistenced.service").write_text("[Unit]\n")
    monkeypatch.setattr(driver_transaction, "UNIT_DIR", str(units))
    node = FakeNode(installed={n: "620.82.01-1" for n in DEB if n != "nvidia-kernel-dkms"},
                    held={n for n in DEB if n != "nvidia-kernel-dkms"}, module_version="620.82.01")
    args = dict(ARGS, enable_services=True)
    code, result = run(node, args, capsys, monkeypatch, check=True)
    assert code == 0 and result["services"] == {"nvidia-persistenced": "would_enable"}, result
    assert node.enabled == set()
    code, result = run(node, args, capsys, monkeypatch)
    assert code == 0, result
    assert result["services"]["nvidia-persistenced"] == "enabled_now" and node.enabled == {"nvidia-persistenced"}
    assert result["changed"] is True
    code, result = run(node, args, capsys, monkeypatch)
    assert result["services"]["nvidia-persistenced"] == "enabled" and result["changed"] is False, result
    (units / "nvidia-persistenced.service").unlink()
    code, result = run(node, args, capsys, monkeypatch)
    assert result["services"] == {"nvidia-persistenced": "absent"}
