# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the driver_resolve module's main() with a simulated apt and read the JSON it prints."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.nvidia.plugins.modules import driver_resolve

DEB = ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "nvidia-kernel-support",
       "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-smi", "nvidia-persistenced",
       "nvidia-fabricmanager", "libnvidia-nscq"]
REPO_VERSIONS = ["580.126.20-1", "580.159.03-1", "620.70.06-1", "620.82.01-1"]


def fake_apt(installed_lines="", held=""):
    calls = []

    def run_command(self, args, **kwargs):
        calls.append(list(args))
        if args[0] == "dpkg-query":
            return 0, installed_lines, ""
        if args[:2] == ["apt-mark", "showhold"]:
            return 0, held, ""
        if args[0] == "apt-cache":
            names = args[args.index("madison") + 1:]
            out = []
            for name in names:
                if name in DEB:
                    out += ["%s | %s | http://127.0.0.1:8080/n1/debian12/x86_64 ./ Packages" % (name, v)
                            for v in REPO_VERSIONS]
                elif name.startswith("nvidia-driver-pinning-"):
                    branch = name.rsplit("-", 1)[1]
                    out.append("%s | %s-5 | http://127.0.0.1:8080/n1/debian12/x86_64 ./ Packages" % (name, branch))
            return 0, "\n".join(out) + "\n", ""
        raise AssertionError("unexpected command %s" % args)
    return run_command, calls


def run_module(args, capsys, monkeypatch, installed_lines="", held="", nvswitches=0):
    runner, calls = fake_apt(installed_lines, held)
    monkeypatch.setattr(AnsibleModule, "run_command", runner)
    monkeypatch.setattr(driver_resolve, "count_nvswitches", lambda: nvswitches)
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            driver_resolve.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out), calls


def test_fresh_h100_ltsb_with_nvswitches(capsys, monkeypatch):
    code, result, calls = run_module({"branch": "ltsb", "gpu_architectures": ["Hopper"], "distribution": "debian12",
                                      "today": "2026-11-29", "repository": {"url": "http://127.0.0.1:8080/"}},
                                     capsys, monkeypatch, nvswitches=4)
    assert code == 0 and result["changed"] is False
    assert (result["resolved"]["branch"], result["resolved"]["version"]) == ("620", "620.82.01")
    assert result["fabric_manager"] is True and result["nvswitch_count"] == 4
    plan = result["plan"]
    assert "nvidia-fabricmanager=620.82.01-1" in plan["install"]
    assert plan["install"][0] == "nvidia-driver-pinning-620=620-5"
    assert result["available_versions"] == ["580.126.20", "580.159.03", "620.70.06", "620.82.01"]
    assert not any(c[0] in ("apt-get",) for c in calls)


def test_v100_branch_620_refused_naming_gpus(capsys, monkeypatch):
    gpus = [{"index": i, "name": "Tesla V100-SXM2-32GB", "architecture": "Volta"} for i in range(8)]
    code, result, _calls = run_module({"branch": "620", "gpus": gpus, "distribution": "debian12",
                                       "today": "2026-11-29", "repository": {"url": "http://x/"}},
                                      capsys, monkeypatch)
    assert code == 1 and result["failed"] is True
    assert result["code"] == "architecture_unsupported"
    assert "8\u00d7 Tesla V100-SXM2-32GB (Volta)" in result["msg"]
    assert result["allowed"] == ["ltsb (R580)", "580"]


def test_version_not_in_repository_refused(capsys, monkeypatch):
    code, result, _calls = run_module({"branch": "580", "version": "580.105.08", "gpu_architectures": ["Hopper"],
                                       "distribution": "debian12", "today": "2026-11-29",
                                       "repository": {"url": "http://x/"}}, capsys, monkeypatch)
    assert code == 1 and result["code"] == "version_not_in_repository"
    assert "580.126.20, 580.159.03" in result["msg"]


def test_installed_and_pinned_is_a_noop(capsys, monkeypatch):
    lines = "\n".join("hi  %s 620.82.01-1 amd64" % n for n in DEB if n not in (
        "nvidia-kernel-dkms", "nvidia-fabricmanager", "libnvidia-nscq")) + "\nhi  nvidia-driver-pinning-620 620-5 all\n"
    held = "\n".join(n for n in DEB) + "\nnvidia-driver-pinning-620\n"
    code, result, _calls = run_module({"branch": "620", "gpu_architectures": ["Hopper"], "distribution": "debian12",
                                       "today": "2026-11-29", "fabric_manager": "disabled",
                                       "repository": {"url": "http://x/"}}, capsys, monkeypatch,
                                      installed_lines=lines, held=held)
    assert code == 0
    assert result["plan"]["install"] == [] and result["plan"]["remove"] == []
    assert result["plan"]["current_version"] == "620.82.01"
