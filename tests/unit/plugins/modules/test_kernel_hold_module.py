"""Run the kernel_hold module's main() as Ansible does, with dpkg and apt-mark faked (unit test)."""

import json

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.nvidia.plugins.modules import kernel_hold

KERNEL = "6.1.0-31-amd64"
DPKG = "\n".join([
    "ii  linux-image-%s 6.1.128-1 amd64" % KERNEL,
    "ii  linux-headers-%s 6.1.128-1 amd64" % KERNEL,
    "ii  linux-image-amd64 6.1.128-1 amd64",
    "rc  linux-image-6.1.0-30-amd64 6.1.124-1 amd64",
    "ii  openssh-server 1:9.2p1-2 amd64",
    "ii  nvidia-driver 580.126.20-1 amd64",
]) + "\n"


class FakeNode:
    """dpkg-query, apt-mark showhold and dpkg --set-selections of one node, in memory."""

    def __init__(self, held):
        self.held = set(held)
        self.selections = []

    def run_command(self, args, data=None, **_kwargs):
        if args[0] == "dpkg-query":
            return 0, DPKG, ""
        if args[:2] == ["apt-mark", "showhold"]:
            return 0, "".join("%s\n" % n for n in sorted(self.held)), ""
        if args[:2] == ["dpkg", "--set-selections"]:
            for line in data.splitlines():
                name, selection = line.split()
                self.selections.append((name, selection))
                (self.held.add if selection == "hold" else self.held.discard)(name)
            return 0, "", ""
        raise AssertionError("unexpected command %s" % args)


@pytest.fixture(name="node")
def fixture_node(monkeypatch):
    node = FakeNode(held=["linux-headers-%s" % KERNEL])  # an administrator's hold
    monkeypatch.setattr(AnsibleModule, "run_command", node.run_command)
    monkeypatch.setattr(kernel_hold.platform, "release", lambda: KERNEL)
    monkeypatch.setattr(kernel_hold.os, "chown", lambda *_args: None)
    return node


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            kernel_hold.main()
    return exit_info.value.code, json.loads(capsys.readouterr().out)


def paths(tmp_path):
    return {"record": str(tmp_path / "facts.d" / "gpufleet_kernel_hold.fact"), "apt_conf": str(tmp_path / "51hold")}


def test_holds_the_running_kernel_and_records_only_its_own_holds(node, tmp_path, capsys):
    code, result = run_module(dict(paths(tmp_path), packages_extra=["openssh-server", "not-installed"]), capsys)
    assert code == 0 and result["changed"] is True
    assert result["running_kernel"] == KERNEL
    assert result["running_kernel_package"] == "linux-image-%s" % KERNEL
    assert result["held"] == ["linux-headers-%s" % KERNEL, "linux-image-%s" % KERNEL, "linux-image-amd64", "openssh-server"]
    assert result["held_by_role"] == ["linux-image-%s" % KERNEL, "linux-image-amd64", "openssh-server"]
    assert result["held_before_by_others"] == ["linux-headers-%s" % KERNEL]
    assert sorted(node.selections) == [("linux-image-%s" % KERNEL, "hold"), ("linux-image-amd64", "hold"),
                                       ("openssh-server", "hold")]
    record = json.loads((tmp_path / "facts.d" / "gpufleet_kernel_hold.fact").read_text())
    assert record == {"schema_version": 1, "package_manager": "apt", "running_kernel": KERNEL,
                      "held_by_role": result["held_by_role"], "config_files": [str(tmp_path / "51hold")]}
    blacklist = (tmp_path / "51hold").read_text()
    # Field case 17: unattended-upgrade moved libnvidia-common-460 under a loaded module.
    assert '"nvidia-";' in blacklist and '"libnvidia-";' in blacklist and "Unattended-Upgrade::Package-Blacklist {" in blacklist
    assert oct((tmp_path / "51hold").stat().st_mode & 0o777) == "0o644"
    # Again: nothing to do, and the administrator's hold is still not the role's.
    node.selections = []
    code, result = run_module(dict(paths(tmp_path), packages_extra=["openssh-server"]), capsys)
    assert code == 0 and result["changed"] is False and node.selections == []
    assert result["held_before_by_others"] == ["linux-headers-%s" % KERNEL]


def test_check_mode_reports_and_writes_nothing(node, tmp_path, capsys):
    code, result = run_module(dict(paths(tmp_path), _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert code == 0 and result["changed"] is True
    assert result["held_by_role"] == ["linux-image-%s" % KERNEL, "linux-image-amd64"]
    assert "Package-Blacklist" in result["diff"]["after"] and result["diff"]["before"] == ""
    assert node.selections == [] and not (tmp_path / "51hold").exists() and not (tmp_path / "facts.d").exists()


def test_absent_releases_what_the_record_names_and_nothing_else(node, tmp_path, capsys):
    run_module(paths(tmp_path), capsys)
    node.selections = []
    code, result = run_module(dict(paths(tmp_path), state="absent"), capsys)
    assert code == 0 and result["changed"] is True
    assert result["released"] == ["linux-image-%s" % KERNEL, "linux-image-amd64"] and result["held"] == []
    assert sorted(node.selections) == [("linux-image-%s" % KERNEL, "install"), ("linux-image-amd64", "install")]
    assert node.held == {"linux-headers-%s" % KERNEL}
    assert not (tmp_path / "51hold").exists() and not (tmp_path / "facts.d" / "gpufleet_kernel_hold.fact").exists()
    code, result = run_module(dict(paths(tmp_path), state="absent"), capsys)
    assert code == 0 and result["changed"] is False and result["released"] == []


def test_a_record_that_is_not_json_is_refused_naming_it(node, tmp_path, capsys):
    (tmp_path / "facts.d").mkdir()
    record = tmp_path / "facts.d" / "gpufleet_kernel_hold.fact"
    record.write_text("{not json")
    for state in ("present", "absent"):
        code, result = run_module(dict(paths(tmp_path), state=state), capsys)
        assert code == 1 and result["msg"].startswith("%s cannot be read as this role's record" % record)
    record.write_text("[1, 2]")
    code, result = run_module(paths(tmp_path), capsys)
    assert code == 1 and result["msg"] == "%s is not this role's record (a JSON object): inspect it and remove it" % record
    assert node.selections == [] and record.read_text() == "[1, 2]"


def test_apt_mark_failing_fails_the_module(node, tmp_path, capsys, monkeypatch):
    def failing(args, data=None, **kwargs):
        if args[:2] == ["apt-mark", "showhold"]:
            return 100, "", "E: Could not open lock file\n"
        return node.run_command(args, data=data, **kwargs)

    monkeypatch.setattr(AnsibleModule, "run_command", lambda _self, *a, **k: failing(*a, **k))
    code, result = run_module(paths(tmp_path), capsys)
    assert code == 1 and result["msg"] == "apt-mark showhold failed: E: Could not open lock file" and result["rc"] == 100
    assert node.selections == [] and not (tmp_path / "51hold").exists()
