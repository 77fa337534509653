"""Run the gpu_facts module's main() as Ansible does and read the JSON it prints."""

import json
import os
import sys

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import captures  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import CAPTURE_FILES  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.modules import gpu_facts  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            gpu_facts.main()
    result = json.loads(capsys.readouterr().out)
    return exit_info.value.code, result


def test_every_capture_file_is_documented_in_the_option_and_the_readme():
    option = " ".join(yaml.safe_load(gpu_facts.DOCUMENTATION)["options"]["capture_dir"]["description"])
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    assert sorted(name for name in CAPTURE_FILES if "C(%s)" % name not in option) == []
    assert sorted(name for name in CAPTURE_FILES if "`%s`" % name not in readme) == []


def test_capture_dir_gives_the_case_values(tmp_path, capsys):
    bundle = captures.build("dkms-module-older-than-userspace", str(tmp_path / "bundle"))
    code, result = run_module({"capture_dir": bundle}, capsys)
    assert code == 0
    assert result["changed"] is False
    driver = result["ansible_facts"]["nvidia"]["driver"]
    assert (driver["userspace_version"], driver["on_disk_version"], driver["state"]) == ("595.84", "595.80", "broken")


def test_truncated_xml_fails_naming_the_file(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "nvidia-smi-q.xml").write_text("<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n<gpu id=\"00000000:3B:00.0\">")
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1
    assert result["failed"] is True
    assert result["file"] == "nvidia-smi-q.xml"
    assert result["msg"].startswith("nvidia-smi-q.xml: ")


def test_missing_capture_dir_is_a_clear_error(tmp_path, capsys):
    code, result = run_module({"capture_dir": str(tmp_path / "nope")}, capsys)
    assert code == 1
    assert "is not a directory" in result["msg"] and "nvidia-smi-q.xml" in result["msg"]


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia") or os.path.exists("/sys/module/nvidia"),
                    reason="this machine has an NVIDIA driver loaded")
def test_live_host_without_nvidia_driver(capsys, tmp_path, monkeypatch):
    # The package database is this test's, not the machine's: a host with Chromium has libxnvctrl0
    # (not a driver package) and a developer's machine may have anything.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dpkg", "rpm", "apt-mark"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    state_dir = tmp_path / "rollout"
    state_dir.mkdir()
    (state_dir / "drain.json").write_text(json.dumps({"backend": "slurm", "rollout_id": "driver-ltsb",
                                                     "drained_at": "2026-11-29T21:40:02Z"}))
    code, result = run_module({"rollout_state_dir": str(state_dir)}, capsys)
    assert code == 0
    facts = result["ansible_facts"]["nvidia"]
    # The drain record of a rollout is read from the node_upgrade role's state directory.
    assert (facts["rollout"]["drained"], facts["rollout"]["drained_by"]) == (True, "driver-ltsb")
    assert list(facts)[0] == "headline"
    assert facts["source"] == "none"
    assert facts["driver"]["state"] == "not_installed"
    # No driver: no GPU source answered, so the GPUs are not counted (null, not 0).
    assert facts["gpus"] == [] and facts["gpu_count"] is None
    assert result["headline"]["verdict"] == "unhealthy" and result["headline"]["action"] == "install_driver"
    assert facts["driver"]["running_kernel"] == os.uname()[2]


def test_libxnvctrl_alone_is_no_driver(capsys, tmp_path, monkeypatch):
    """Debian's Chromium pulls in libxnvctrl0: that is not an NVIDIA driver."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg").write_text("#!/bin/sh\necho 'ii  libxnvctrl0:amd64  525.85.05-3~deb12u1  amd64  NV-CONTROL X extension'\n")
    (bin_dir / "dpkg").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    code, result = run_module({}, capsys)
    assert code == 0
    assert result["ansible_facts"]["nvidia"]["driver"]["state"] == "not_installed"


# --- capture_dir is untrusted input: links, special and empty files, the reading limit ----------

SECRET = "root:$6$NotARealHash.SecretSalt$0123456789abcdef:19000:0:99999:7:::"
XID79_LINE = "[ 9000.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"


def _secret_outside(tmp_path):
    """A file outside the bundle that stands for /etc/shadow."""
    path = tmp_path / "shadow"
    path.write_text(SECRET + "\n")
    return path


def _bundle(tmp_path, files=None):
    """A bundle directory with ``files`` ({file name: text})."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name, text in (files or {}).items():
        (bundle / name).write_text(text)
    return bundle


def _record_warnings(monkeypatch):
    """The texts given to ``module.warn``, in order.

    They reach the result's ``warnings`` only in a module process: once controller code is
    imported (as other tests of this run do), ansible-core hands them to its Display instead.
    """
    given = []
    original = gpu_facts.AnsibleModule.warn

    def warn(self, warning, **kwargs):
        given.append(warning)
        return original(self, warning, **kwargs)

    monkeypatch.setattr(gpu_facts.AnsibleModule, "warn", warn)
    return given


@pytest.mark.parametrize("filename", ["uname-r.txt", "nvidia-smi-q.xml", "dmesg.txt"])
def test_capture_file_linking_outside_the_bundle_is_refused(tmp_path, capsys, filename):
    secret = _secret_outside(tmp_path)
    bundle = _bundle(tmp_path, {"dmesg.txt": XID79_LINE}) if filename != "dmesg.txt" else _bundle(tmp_path)
    (bundle / filename).symlink_to(secret)
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1 and result["failed"] is True
    assert result["file"] == filename
    assert result["msg"].startswith("%s: is a symbolic link" % filename)
    assert "ansible_facts" not in result
    assert "NotARealHash" not in json.dumps(result)


def test_capture_file_linking_inside_the_bundle_is_refused_too(tmp_path, capsys):
    bundle = _bundle(tmp_path, {"dmesg.txt": XID79_LINE})
    (bundle / "copy-of-dmesg.txt").write_text(XID79_LINE)
    (bundle / "uname-r.txt").symlink_to(bundle / "copy-of-dmesg.txt")
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1 and result["file"] == "uname-r.txt" and "symbolic link" in result["msg"]


def test_capture_file_with_a_second_hard_link_is_refused(tmp_path, capsys):
    secret = _secret_outside(tmp_path)
    bundle = _bundle(tmp_path)
    os.link(str(secret), str(bundle / "uname-r.txt"))
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1 and result["file"] == "uname-r.txt"
    assert result["msg"].startswith("uname-r.txt: has 2 hard links")
    assert "NotARealHash" not in json.dumps(result)


@pytest.mark.parametrize("filename,text,problem", [
    ("nvidia-smi-q.xml", SECRET + "\n", "nvidia-smi-q.xml: expected an <nvidia_smi_log> XML document from "
                                        "nvidia-smi -q -x, but line 1 is not XML"),
    ("nvidia-smi-q.xml", "<nvidia_smi_log>\n<gpu>%s</gpux>\n" % SECRET,
     "nvidia-smi-q.xml: nvidia-smi -q -x output is not well-formed XML, expected a complete <nvidia_smi_log> "
     "document; parsing stopped at line 2, column %d (mismatched tag)" % (len("<gpu>" + SECRET) + 2)),
    ("nvidia-smi-q.xml", "<NotARealHash/>\n", "nvidia-smi-q.xml: expected root element <nvidia_smi_log> "
                                              "(nvidia-smi -q -x), found another root element at line 1"),
    ("nvidia-smi-q.txt", SECRET + "\n", "nvidia-smi-q.txt: expected the '==============NVSMI LOG==============' "
                                        "banner of nvidia-smi -q output; none found in 1 line(s)"),
])
def test_parse_errors_of_a_capture_quote_no_content(tmp_path, capsys, filename, text, problem):
    bundle = _bundle(tmp_path)
    (bundle / filename).write_text(text)
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1 and result["file"] == filename
    assert result["msg"] == problem
    assert "NotARealHash" not in json.dumps(result)


def test_directory_and_empty_capture_files_are_warnings_naming_them(tmp_path, capsys, monkeypatch):
    warned = _record_warnings(monkeypatch)
    bundle = _bundle(tmp_path, {"dmesg.txt": XID79_LINE, "modinfo-nvidia.txt": ""})
    (bundle / "uname-r.txt").mkdir()
    (bundle / "dpkg-l.txt").write_text("\n  \n")
    os.mkfifo(str(bundle / "lspci-vvv.txt"))  # would block a plain open()
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 0
    facts = result["ansible_facts"]["nvidia"]
    assert facts["driver"]["running_kernel"] is None
    assert [e["xid"] for e in facts["xid_events"]] == [79]
    expected = [
        "capture_dir: dpkg-l.txt holds only white space; ignored, its fields are null",
        "capture_dir: lspci-vvv.txt is not a regular file (a FIFO, socket or device); ignored, its fields are null",
        "capture_dir: modinfo-nvidia.txt is empty; ignored, its fields are null",
        "capture_dir: uname-r.txt is a directory, not a file; ignored, its fields are null",
    ]
    assert facts["warnings"] == expected
    assert warned == expected


def test_an_empty_only_capture_file_fails_naming_it(tmp_path, capsys):
    bundle = _bundle(tmp_path, {"dmesg.txt": ""})
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1
    assert result["file"] == "dmesg.txt"
    assert result["msg"] == "capture_dir %s has no usable capture file: dmesg.txt is empty" % bundle


def test_a_bundle_without_capture_files_fails(tmp_path, capsys):
    bundle = _bundle(tmp_path, {"notes.txt": "nothing here"})
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1
    assert result["msg"].startswith("capture_dir %s holds none of the capture files" % bundle)


def test_capture_dmesg_over_the_limit_keeps_the_newest_part(tmp_path, capsys, monkeypatch):
    warned = _record_warnings(monkeypatch)
    monkeypatch.setattr(gpu_facts, "_MAX_FILE_BYTES", 4096)
    old = "".join("[%12.6f] NVRM: Xid (PCI:0000:5e:00): 13, pid=%d, name=x, Graphics Exception\n" % (100.0 + 100 * i, i)
                  for i in range(200))
    bundle = _bundle(tmp_path, {"dmesg.txt": old + XID79_LINE})
    size = os.path.getsize(str(bundle / "dmesg.txt"))
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 0
    facts = result["ansible_facts"]["nvidia"]
    events = facts["xid_events"]
    # The newest line, the fatal Xid 79, is read; the oldest lines are not.
    assert events[-1]["xid"] == 79 and events[-1]["fatal"] is True
    assert facts["xid_summary"]["fatal_xids"] == [79]
    assert events[0]["xid"] == 13 and events[0]["time"] > 100.0
    # Whole lines of the last 4096 bytes: 49 lines of about 83 bytes.
    lines = (bundle / "dmesg.txt").read_text().splitlines(True)
    kept = "".join(lines[-49:])
    assert len(kept) <= 4096 < len("".join(lines[-50:]))
    assert sum(e["count"] for e in events) == 49
    [warning] = [w for w in facts["warnings"] if "reading limit" in w]
    assert warning == ("capture_dir: dmesg.txt is %d bytes, over the 4096 bytes reading limit: only its newest "
                       "%d bytes (the end of the file, whole lines) were read, the oldest %d bytes left out"
                       % (size, len(kept), size - len(kept)))
    assert warned == [warning]


def test_live_kernel_log_over_the_limit_keeps_the_newest_part(capsys, tmp_path, monkeypatch):
    warned = _record_warnings(monkeypatch)
    monkeypatch.setattr(gpu_facts, "_MAX_FILE_BYTES", 4096)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "dmesg.log"
    log.write_text("".join("[%12.6f] NVRM: Xid (PCI:0000:5e:00): 13, pid=%d, name=x, Graphics Exception\n"
                           % (100.0 + 100 * i, i) for i in range(200)) + XID79_LINE)
    (bin_dir / "dmesg").write_text("#!/bin/sh\ncat '%s'\n" % log)
    for tool in ("dpkg", "rpm", "apt-mark"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    for tool in ("dmesg", "dpkg", "rpm", "apt-mark"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/bin:/usr/bin" % bin_dir)
    monkeypatch.setattr(gpu_facts, "load_pynvml", lambda: None)
    code, result = run_module({"backend": "nvidia-smi"}, capsys)
    assert code == 0
    facts = result["ansible_facts"]["nvidia"]
    assert facts["xid_events"][-1]["xid"] == 79
    assert facts["xid_events"][0]["time"] > 100.0
    [warning] = [w for w in facts["warnings"] if w.startswith("kernel log: dmesg printed")]
    assert "over the 4096 reading limit: only the newest" in warning
    assert warning in warned


def test_the_triage_bundle_in_the_readme_is_the_case_and_gives_its_verdict(capsys):
    # README.md: `ansible localhost -m gpufleet.nvidia.gpu_facts -a capture_dir=.../tests/fixtures/bundles/...`
    name = "dkms-module-older-than-userspace"
    path = os.path.join(os.path.dirname(captures.CASES), "bundles", name)
    files = {}
    for entry in sorted(os.listdir(path)):
        with open(os.path.join(path, entry), "rb") as handle:
            files[entry] = handle.read()
    assert files == captures.read(name)
    code, result = run_module({"capture_dir": path}, capsys)
    assert code == 0
    driver = result["ansible_facts"]["nvidia"]["driver"]
    assert (driver["userspace_version"], driver["on_disk_version"], driver["state"]) == ("595.84", "595.80", "broken")


def test_capture_gives_the_contract_and_the_node_problem(tmp_path, capsys):
    bundle = captures.build("a100-mig-peermem-refused", str(tmp_path / "bundle"))
    code, result = run_module({"capture_dir": bundle}, capsys)
    assert code == 0
    nvidia = result["ansible_facts"]["nvidia"]
    contract = nvidia["contract"]
    assert contract["node"]["driver_userspace_version"] == "535.54.03"
    assert contract["node"]["cuda_driver_version"] == "12.2"
    assert contract["node"]["peermem_state"] == "failed"
    assert contract["gpus"][0]["power_default_limit_w"] == 500.0 and contract["gpus"][0]["mig_capable"] is True
    assert [unit["pci_bus_id"] for unit in contract["units"]] == [nvidia["gpus"][0]["pci_bus_id"]]
    assert [p["kind"] for p in nvidia["health"]["problems"]] == ["peermem_not_loaded"]
    assert nvidia["health"]["gpus"] == []
