# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the gpu_trace module's main() against the simulated fleet's NVML and nvidia-smi (a fake node root).

Without a command, sampling runs on a test clock (``gpu_trace._monotonic`` and ``_sleep``), so the
sample count is exact and the test takes no time; with a command, on the real clock.
"""

import os
import stat
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from simnode import fault, make_node_root, run_main, warnings_of  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu import SIMGPU_LIB_DIR  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import initial_state, write_node_root  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.modules import gpu_trace  # noqa: E402

HEADER = ("time_s,gpu,pci_bus_id,uuid,pstate,sm_clock_mhz,mem_clock_mhz,power_w,temperature_c,utilization_gpu_pct,"
          "clocks_event_reasons")
GPU0_UUID = "GPU-d64c1ccd-29bf-5a87-a161-c6dff88cf767"


class Clock(object):
    """A clock that only moves when the module sleeps."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        assert seconds > 0
        self.now += seconds


@pytest.fixture(name="clock")
def fixture_clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(gpu_trace, "_monotonic", clock.monotonic)
    monkeypatch.setattr(gpu_trace, "_sleep", clock.sleep)
    return clock


@pytest.fixture(name="node")
def fixture_node(tmp_path, monkeypatch):
    """A fake h100 node root; the module's pynvml is the simulated NVML."""
    return make_node_root(tmp_path, monkeypatch, gpu_trace, "h100")


def _write_script(path, body):
    with open(path, "w") as handle:
        handle.write("#!%s\n%s" % (sys.executable, body))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


@pytest.fixture(name="smi_only")
def fixture_smi_only(node, tmp_path, monkeypatch):
    """No pynvml; the simulated nvidia-smi first in PATH. Returns (root, bin directory)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_script(str(bin_dir / "nvidia-smi"), "import sys\nsys.path.insert(0, %r)\nfrom simgpu import smi\n"
                                               "sys.exit(smi.main(sys.argv[1:]))\n" % SIMGPU_LIB_DIR)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bin_dir)
    monkeypatch.setattr(gpu_trace, "load_pynvml", lambda: None)
    return node, bin_dir


def run_module(args, capsys, check_mode=False):
    """Run gpu_trace.main() as Ansible does; see simnode.run_main."""
    return run_main(gpu_trace.main, args, capsys, check_mode=check_mode)


def test_defaults_given_as_strings_sample_5_seconds_every_half_second(node, clock, capsys):
    # Extra vars arrive as strings: the argument spec makes floats of them.
    code, result = run_module({"duration_s": "5", "interval_s": "0.5"}, capsys)
    assert code == 0, result
    assert result["changed"] is False and result["source"] == "nvml"
    # The first sample at 0 s, the last at 5 s.
    assert result["samples"] == 11 and result["duration_s"] == 5.0
    assert len(result["rows"]) == 11 * 8
    assert result["columns"] == HEADER.split(",")
    assert result["rows"][0] == [0.0, 0, "0000:18:00.0", GPU0_UUID, "P0", 345, 2619, 68.9, 29, 0, "gpu_idle"]
    assert result["rows"][-1][:3] == [5.0, 7, result["rows"][7][2]]
    lines = result["csv"].splitlines()
    assert lines[0] == HEADER
    assert lines[1] == "0.000,0,0000:18:00.0,%s,P0,345,2619,68.9,29,0,gpu_idle" % GPU0_UUID
    assert len(lines) == 1 + 88
    gpu0 = result["summary"]["0000:18:00.0"]
    assert gpu0["samples"] == 11
    assert (gpu0["sm_clock_mhz"], gpu0["power_w"]) == ({"median": 345, "max": 345}, {"median": 68.9, "max": 68.9})
    assert gpu0["clocks_event_reasons"] == {"gpu_idle": 1.0} and gpu0["sm_clock_at_power_cap_mhz"] is None
    assert len(result["summary"]) == 8 and result["unsupported"] == []
    assert "command" not in result
    assert clock.now == 1005.0


def test_a_baseline_says_what_moved_since(node, clock, capsys):
    code, first = run_module({"duration_s": 1, "interval_s": 0.5}, capsys)
    assert code == 0
    baseline = first["summary"]
    code, same = run_module({"duration_s": 1, "interval_s": 0.5, "baseline": baseline}, capsys)
    assert code == 0 and same["changes"] == []
    moved = dict((key, dict(gpu, sm_clock_mhz={"median": 1410, "max": 1410})) for key, gpu in baseline.items())
    code, result = run_module({"duration_s": 1, "interval_s": 0.5, "baseline": moved}, capsys)
    assert code == 0
    assert "median SM clock: 1410 → 345 MHz on 8 GPUs" in result["changes"]
    code, result = run_module({"duration_s": 1, "interval_s": 0.5, "baseline": {"x": 1}}, capsys)
    assert code == 0 and result["changes"] is None
    assert "changes" not in first


def test_check_mode_samples_as_well(node, clock, capsys):
    code, result = run_module({"duration_s": 1, "interval_s": 0.25}, capsys, check_mode=True)
    assert code == 0 and result["changed"] is False
    assert result["samples"] == 5 and [row[0] for row in result["rows"][::8]] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_value_nvml_refuses_is_null_and_listed_once(node, clock, capsys):
    fault(node, "nvml_not_supported", {"field": "power_usage", "gpu": 3})
    code, result = run_module({"duration_s": 1, "interval_s": 0.5}, capsys)
    assert code == 0, result
    assert [row[7] for row in result["rows"] if row[1] == 3] == [None] * 3
    assert result["rows"][2][7] == 68.9
    assert result["summary"][result["rows"][3][2]]["power_w"] == {"median": None, "max": None}
    assert result["unsupported"] == [{"gpu": 3, "column": "power_w", "call": "nvmlDeviceGetPowerUsage",
                                      "error": "NotSupported"}]


def test_command_of_one_second_is_sampled_while_it_runs(node, capsys):
    code, result = run_module({"command": ["sleep", "1"], "interval_s": 0.2}, capsys)
    assert code == 0, result
    assert result["command"]["rc"] == 0
    assert result["samples"] >= 2 and len(result["rows"]) == 8 * result["samples"]
    assert 1.0 <= result["command"]["elapsed_s"] < 5.0
    times = sorted({row[0] for row in result["rows"]})
    assert times[0] < 0.2 and times[-1] < result["command"]["elapsed_s"]


def test_command_output_is_returned(node, capsys):
    code, result = run_module({"command": ["sh", "-c", "echo 'GEMM 1024 TFLOPS'; echo slow >&2"], "interval_s": 0.1},
                              capsys)
    assert code == 0, result
    assert result["command"]["stdout_lines"] == ["GEMM 1024 TFLOPS"]
    assert result["command"]["stderr_lines"] == ["slow"]


def test_command_exiting_3_fails_with_the_trace(node, capsys):
    code, result = run_module({"command": ["sh", "-c", "sleep 0.3; exit 3"], "interval_s": 0.1}, capsys)
    assert code == 1 and result["failed"] is True
    assert result["msg"].startswith("command sh exited with rc 3; the trace of its ")
    assert result["command"]["rc"] == 3
    assert result["samples"] >= 1 and len(result["rows"]) == 8 * result["samples"]
    assert result["csv"].splitlines()[0] == HEADER


def test_command_over_its_timeout_is_killed_and_fails(node, capsys):
    code, result = run_module({"command": ["sleep", "30"], "interval_s": 0.1, "command_timeout_s": 0.5}, capsys)
    assert code == 1
    assert result["msg"].startswith("command sleep did not exit within command_timeout_s=0.5 seconds; it was killed")
    assert result["command"]["rc"] == -9
    assert 0.5 <= result["command"]["elapsed_s"] < 5.0
    assert result["samples"] >= 2


def test_command_not_found_fails_naming_it(node, capsys):
    code, result = run_module({"command": ["no-such-benchmark-here"]}, capsys)
    assert code == 1 and result["msg"] == "command: no-such-benchmark-here was not found in PATH on this node"


@pytest.mark.parametrize("args, message", [
    ({"duration_s": 0}, "duration_s must be more than 0 and at most 600 seconds, got 0"),
    ({"duration_s": "601"}, "duration_s must be more than 0 and at most 600 seconds, got 601"),
    ({"interval_s": "0.01"}, "interval_s must be at least 0.05 seconds, got 0.01"),
    ({"command": []}, "command must be a non-empty argv list"),
    ({"command": ["true"], "command_timeout_s": 0}, "command_timeout_s must be more than 0 seconds, got 0"),
])
def test_out_of_range_options_fail_saying_what_is_allowed(node, capsys, args, message):
    code, result = run_module(args, capsys)
    assert code == 1 and result["msg"].startswith(message)


def test_nvml_asked_for_without_pynvml_fails(monkeypatch, capsys):
    monkeypatch.setattr(gpu_trace, "load_pynvml", lambda: None)
    code, result = run_module({"source": "nvml"}, capsys)
    assert code == 1 and result["msg"].startswith("source=nvml was asked for, but the pynvml module")


def unloaded_root(tmp_path, monkeypatch):
    """A node root whose NVIDIA kernel module is not loaded; NVML and nvidia-smi serve it from now on."""
    root = str(tmp_path / "unloaded")
    write_node_root(root, initial_state("h100", "node-h100"), loaded=False)
    monkeypatch.setenv("SIMGPU_ROOT", root)
    return root


def test_nvml_that_cannot_start_fails_with_the_reason(node, tmp_path, monkeypatch, capsys):
    unloaded_root(tmp_path, monkeypatch)
    code, result = run_module({"duration_s": 0.1}, capsys)
    assert code == 1 and result["nvml_error"] == "DriverNotLoaded"
    assert result["msg"].startswith("NVML could not start: the NVIDIA kernel module is not loaded")
    assert "rows" not in result


def test_nvidia_smi_without_pynvml(smi_only, clock, capsys):
    code, result = run_module({"duration_s": 1, "interval_s": 0.5}, capsys)
    assert code == 0, result
    assert result["source"] == "nvidia_smi" and result["samples"] == 3 and len(result["rows"]) == 24
    # nvidia-smi prints 68.92 W: 68.9 in the trace, as through NVML.
    assert result["rows"][0] == [0.0, 0, "0000:18:00.0", GPU0_UUID, "P0", 345, 2619, 68.9, 29, 0, "gpu_idle"]
    assert result["summary"]["0000:18:00.0"]["samples"] == 3


def test_nvidia_smi_source_asked_for_with_pynvml_present(smi_only, clock, monkeypatch, capsys):
    monkeypatch.setattr(gpu_trace, "load_pynvml", lambda: pytest.fail("pynvml loaded for source=nvidia_smi"))
    code, result = run_module({"duration_s": 0.5, "source": "nvidia_smi"}, capsys)
    assert code == 0 and result["source"] == "nvidia_smi" and result["samples"] == 2


def test_nvidia_smi_before_r535_is_asked_for_the_throttle_reasons(smi_only, clock, capsys):
    _root, bin_dir = smi_only
    os.rename(str(bin_dir / "nvidia-smi"), str(bin_dir / "nvidia-smi-r535"))
    _write_script(str(bin_dir / "nvidia-smi"),
                  "import os, sys\n"
                  "if any('clocks_event_reasons' in arg for arg in sys.argv):\n"
                  "    print('Field \"clocks_event_reasons.active\" is not a valid field to query.')\n"
                  "    print()\n"
                  "    sys.exit(2)\n"
                  "os.execv(%r, [%r] + sys.argv[1:])\n" % (str(bin_dir / "nvidia-smi-r535"), "nvidia-smi"))
    code, result = run_module({"duration_s": 0.5}, capsys)
    assert code == 0, result
    assert result["samples"] == 2 and {row[10] for row in result["rows"]} == {"gpu_idle"}


def test_nvidia_smi_lost_gpu_gives_a_row_of_nulls(smi_only, clock, capsys):
    root, _bin_dir = smi_only
    fault(root, "gpu_lost", {"gpu": 2, "when": "now"})
    code, result = run_module({"duration_s": 0.5}, capsys)
    assert code == 0, result
    lost = [row for row in result["rows"] if row[1] is None]
    assert len(lost) == 2 and all(row[4:] == [None] * 7 for row in lost)
    bus_id = lost[0][2]
    assert result["summary"][bus_id]["samples"] == 2 and result["summary"][bus_id]["sm_clock_mhz"]["median"] is None
    assert len(result["rows"]) == 16


def test_nvidia_smi_failing_at_the_first_sample_fails(smi_only, clock, tmp_path, monkeypatch, capsys):
    unloaded_root(tmp_path, monkeypatch)
    code, result = run_module({"duration_s": 0.5}, capsys)
    assert code == 1 and result["rc"] == 9
    assert result["msg"] == ("nvidia-smi --query-gpu failed (rc 9): NVIDIA-SMI has failed because it couldn't "
                             "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed "
                             "and running.")


def test_neither_pynvml_nor_nvidia_smi_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_trace, "load_pynvml", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpu_trace.AnsibleModule, "get_bin_path", lambda self, name, *args, **kwargs: None)
    code, result = run_module({}, capsys)
    assert code == 1 and result["msg"].startswith("neither the pynvml module (package nvidia-ml-py")
    assert warnings_of(result) == []


def test_nvidia_smi_failing_later_leaves_that_sample_out_with_a_warning(smi_only, clock, tmp_path, capsys):
    _root, bin_dir = smi_only
    os.rename(str(bin_dir / "nvidia-smi"), str(bin_dir / "nvidia-smi-real"))
    calls = tmp_path / "calls"
    # The second of three samples meets a driver that stopped answering.
    _write_script(str(bin_dir / "nvidia-smi"),
                  "import os, sys\n"
                  "with open(%r, 'a+') as handle:\n"
                  "    handle.write('x')\n"
                  "    handle.seek(0)\n"
                  "    count = len(handle.read())\n"
                  "if count == 2:\n"
                  "    print('Failed to initialize NVML: Unknown Error')\n"
                  "    sys.exit(255)\n"
                  "os.execv(%r, ['nvidia-smi'] + sys.argv[1:])\n" % (str(calls), str(bin_dir / "nvidia-smi-real")))
    code, result = run_module({"duration_s": 1}, capsys)
    assert code == 0, result
    assert result["samples"] == 2 and sorted({row[0] for row in result["rows"]}) == [0.0, 1.0]
    assert warnings_of(result) == ["1 of 3 nvidia-smi samples failed and are left out; the first: nvidia-smi --query-gpu "
                                   "failed (rc 255): Failed to initialize NVML: Unknown Error"]


def _state_of(pid):
    """The process state letter of ``pid`` (``Z`` for a zombie), or ``None`` when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_command_over_its_timeout_is_killed_with_the_processes_it_started(node, tmp_path, capsys):
    pid_file = tmp_path / "child.pid"
    code, result = run_module({"command": ["sh", "-c", "sleep 30 & echo $! > %s; wait" % pid_file], "interval_s": 0.1,
                               "command_timeout_s": 0.5}, capsys)
    assert code == 1 and result["command"]["rc"] == -9
    assert result["command"]["elapsed_s"] < 5.0
    assert _state_of(int(pid_file.read_text())) in (None, "Z")


def test_command_argv_is_taken_word_for_word(node, capsys):
    code, result = run_module({"command": ["echo", "$HOME", "~", "a b"], "interval_s": 0.1}, capsys)
    assert code == 0, result
    assert result["command"]["stdout_lines"] == ["$HOME ~ a b"]
