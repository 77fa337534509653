#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_trace
short_description: Sample every GPU's clocks, power, temperature and clocks event reasons as a short trace
version_added: "0.2.0"
description:
  - Samples every GPU of the node every O(interval_s) seconds for O(duration_s) seconds, or while O(command)
    (a benchmark) runs, and returns the trace as rows, as CSV and summarized per GPU. Taken before and after a
    driver update, two traces are the evidence of what the update did to clocks, power and capping behaviour.
  - Each row holds, for one GPU at one instant, C(time_s) (seconds since the trace started), C(gpu) (index),
    C(pci_bus_id), C(uuid), C(pstate), C(sm_clock_mhz), C(mem_clock_mhz), C(power_w), C(temperature_c),
    C(utilization_gpu_pct) and C(clocks_event_reasons) (names joined with C(|), such as C(gpu_idle|sw_power_cap),
    or C(none)). The unit and the NVML call of each column are in the collection's C(docs/contract.md), in its
    section on GPU traces.
  - A value the GPU will not give is V(null), never 0; a GPU that is lost has every measured value V(null).
  - With O(command), sampling runs from the command's start until it exits; a command that runs longer than
    O(command_timeout_s) is killed and the module fails saying so. A command that exits non-zero fails the
    module too. Either way the trace is returned.
  - The two traces of a node are compared with C(gpu_trace.compare) of the collection's module_utils, which says
    in sentences what moved by more than the greater of 2 % and one unit (1 MHz, 1 W, 1 degree, 1 point).
options:
  duration_s:
    description:
      - How long to sample, in seconds, when O(command) is not given; the first sample is taken at once and the
        last at O(duration_s), so 5 s at 0.5 s gives 11 samples.
      - More than 0 and at most 600.
    type: float
    default: 5
  interval_s:
    description:
      - Seconds between two samples; at least 0.05. A sample that takes longer than this skips the instants it
        missed (the samples keep to the grid of O(interval_s)).
    type: float
    default: 0.5
  command:
    description:
      - A command to run while sampling, such as a benchmark, as an argv list taken word for word (no shell, no
        expansion of C(~) or C($VAR)). Its exit status and output are returned in RV(command).
      - It runs in check mode too; give a command that only reads.
    type: list
    elements: str
  command_timeout_s:
    description:
      - Seconds O(command) may run; then it is killed and the module fails. Where C(setsid) (util-linux) is on the
        node, the command runs in a session of its own and the processes it started are killed with it.
    type: float
    default: 3600
  baseline:
    description:
      - The RV(summary) of an earlier trace of this node (the trace before a driver update). When given, the module
        says in RV(changes) what moved since, as C(gpu_trace.compare) of the collection's module_utils does.
    type: dict
  source:
    description:
      - Where the samples come from.
      - V(auto) reads through NVML (the C(pynvml) module of the nvidia-ml-py package) when it can be imported,
        else through C(nvidia-smi --query-gpu).
    type: str
    choices: [auto, nvml, nvidia_smi]
    default: auto
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The module only reads; it samples in check mode as it does otherwise.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - This module supports check mode; it only reads, and C(changed) is always V(false).
  - Reading through NVML needs no root; nvidia-smi adds about 0.1 s to every sample.
requirements:
  - nvidia-ml-py on the managed node for the NVML source (optional), else nvidia-smi.
seealso:
  - module: gpufleet.nvidia.gpu_facts
  - name: NVML API Reference Guide, Device Queries
    description: The NVML calls each column is read with.
    link: https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html
author:
  - gpufleet.nvidia maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Trace the GPUs at idle for 5 seconds
  gpufleet.nvidia.gpu_trace:
  register: idle_trace

- name: Trace the GPUs while a benchmark runs
  gpufleet.nvidia.gpu_trace:
    command: [/opt/bench/gemm, --seconds, "60"]
    interval_s: 0.25
    command_timeout_s: 300
  register: bench_trace

- name: Keep the trace as a CSV file on the controller
  ansible.builtin.copy:
    content: "{{ bench_trace.csv }}"
    dest: "evidence/{{ inventory_hostname }}-before.csv"
    mode: "0644"
  delegate_to: localhost
"""

RETURN = r"""
columns:
  description: The names of the values of each row, in order.
  returned: always
  type: list
  elements: str
  sample: [time_s, gpu, pci_bus_id, uuid, pstate, sm_clock_mhz, mem_clock_mhz, power_w, temperature_c,
           utilization_gpu_pct, clocks_event_reasons]
rows:
  description: One row per GPU and sample, each a list of values in the order of RV(columns); unknown values null.
  returned: always
  type: list
  elements: list
  sample:
    - [0.0, 0, "0000:18:00.0", GPU-13ce364a-0b50-50a7-a8e4-001a125ae621, P0, 1980, 2619, 310.2, 45, 100, sw_power_cap]
csv:
  description: The rows as CSV text with a header line; null is an empty cell.
  returned: always
  type: str
  sample: "time_s,gpu,pci_bus_id,...\n0.000,0,0000:18:00.0,GPU-...,P0,1980,2619,310.2,45,100,sw_power_cap\n"
summary:
  description:
    - Per GPU, keyed by PCI bus id - C(samples), the median and maximum of each measured value, the median SM clock
      of the samples with C(sw_power_cap) or C(hw_slowdown) active (C(sm_clock_at_power_cap_mhz), null when none),
      the share of samples per clocks event reason, and the P-states seen.
  returned: always
  type: dict
  sample:
    "0000:18:00.0":
      gpu: 0
      pci_bus_id: "0000:18:00.0"
      uuid: GPU-13ce364a-0b50-50a7-a8e4-001a125ae621
      samples: 11
      sm_clock_mhz: {median: 1980, max: 1980}
      mem_clock_mhz: {median: 2619, max: 2619}
      power_w: {median: 310.2, max: 355.0}
      temperature_c: {median: 45, max: 47}
      utilization_gpu_pct: {median: 100, max: 100}
      sm_clock_at_power_cap_mhz: 1410
      clocks_event_reasons: {sw_power_cap: 0.545}
      pstates: [P0]
source:
  description: Where the samples came from.
  returned: always
  type: str
  choices: [nvml, nvidia_smi]
changes:
  description:
    - With O(baseline), what moved since that trace, one sentence per change (GPUs with one change share one); an
      empty list when nothing moved by more than the greater of 2 % and one unit; null when the baseline is not a
      trace summary (a warning says why).
  returned: when O(baseline) is given
  type: list
  elements: str
  sample: ["SM clock at power cap: 1410 → 1140 MHz on 8 GPUs"]
samples:
  description: How many instants were sampled (each gives one row per GPU).
  returned: always
  type: int
  sample: 11
duration_s:
  description: Seconds from the first sample to the end of the trace, as measured.
  returned: always
  type: float
  sample: 5.002
unsupported:
  description: The values a GPU would not give (C(gpu), C(column), C(call), C(error)), each once.
  returned: always
  type: list
  elements: dict
  sample: [{gpu: 3, column: power_w, call: nvmlDeviceGetPowerUsage, error: NotSupported}]
command:
  description: The command's exit status (-9 when killed at the timeout), output lines and seconds it ran.
  returned: when O(command) is given
  type: dict
  sample: {rc: 0, stdout_lines: ["GEMM 1024 TFLOPS"], stderr_lines: [], elapsed_s: 60.013}
"""

import math
import os
import signal
import sys
import threading
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_trace import (
    COLUMNS,
    SMI_FIELDS,
    SMI_REASONS_FIELD_OLD,
    nvml_gpus,
    parse_smi_query,
    compare,
    row_values,
    sample_nvml,
    smi_lost_gpu,
    smi_query_argv,
    smi_rejected_field,
    summarize,
    to_csv,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import load_pynvml
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import run_with_nvml

# The clock and the sleep of the sampling loop (a test gives its own when no command runs).
_monotonic = time.monotonic
_sleep = time.sleep
MAX_DURATION_S = 600.0
MIN_INTERVAL_S = 0.05


def _check_params(module):
    """Fail the module for out-of-range options, saying what is allowed."""
    params = module.params
    if not 0 < params["duration_s"] <= MAX_DURATION_S:
        module.fail_json(msg="duration_s must be more than 0 and at most %g seconds, got %g"
                         % (MAX_DURATION_S, params["duration_s"]))
    if params["interval_s"] < MIN_INTERVAL_S:
        module.fail_json(msg="interval_s must be at least %g seconds, got %g" % (MIN_INTERVAL_S, params["interval_s"]))
    if params["command"] is not None:
        if not params["command"] or not params["command"][0]:
            module.fail_json(msg="command must be a non-empty argv list, such as [/opt/bench/gemm, --seconds, '60']")
        if not params["command_timeout_s"] > 0:
            module.fail_json(msg="command_timeout_s must be more than 0 seconds, got %g" % params["command_timeout_s"])


class _Command(object):
    """A command run by ``module.run_command`` in a thread of its own while the GPUs are sampled.

    Where util-linux ``setsid`` is found the command starts as the leader of a session of its own
    (``setsid`` executes it in place, same pid), so that a kill at the timeout reaches the processes
    it started too; else only the command itself is killed.
    """

    def __init__(self, module, argv):
        self.argv = list(argv)
        self.process = None
        self.result = None
        self.error = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(module,))
        self._thread.daemon = True

    def _run(self, module):
        try:
            # The argv is the command's, word for word: no shell, no expansion of ~ or $VAR.
            self.result = module.run_command(self.argv, expand_user_and_vars=False, handle_exceptions=False,
                                             before_communicate_callback=self._hold)
        except Exception as error:  # pylint: disable=broad-except
            self.error = error
        finally:
            self._started.set()

    def _hold(self, process):
        self.process = process
        self._started.set()

    def start(self):
        """Start the command; return the exception that kept it from starting, or ``None``."""
        self._thread.start()
        self._started.wait()
        return self.error if self.process is None else None

    def wait(self, seconds):
        """Wait up to ``seconds`` for the command to end and its output to be read; whether it has."""
        self._thread.join(seconds)
        return not self._thread.is_alive()

    def kill(self):
        """Kill the command (with its session, when it leads one) and wait for its output to be read."""
        pid = self.process.pid
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                self.process.kill()
        except OSError:
            pass  # it ended meanwhile
        self._thread.join(10)


def _command(module):
    """Start O(command); fail the module when it cannot be found or started."""
    argv = module.params["command"]
    program = argv[0]
    if "/" not in program:
        program = module.get_bin_path(program)
        if program is None:
            module.fail_json(msg="command: %s was not found in PATH on this node" % argv[0])
    setsid = module.get_bin_path("setsid")
    command = _Command(module, ([setsid] if setsid else []) + [program] + list(argv[1:]))
    error = command.start()
    if error is not None:
        module.fail_json(msg="command: %s could not be started (%s)" % (argv[0], getattr(error, "strerror", None) or error))
    return command


def _trace(module, sample):
    """Run the sampling loop (and the command); return (rows, samples, elapsed_s, command result or None).

    :param sample: a callable ``(time_s) -> [row dicts]`` for one instant.
    """
    params = module.params
    interval = params["interval_s"]
    rows = []
    samples = 0
    tick = 0
    timed_out = False
    start = _monotonic()
    command = _command(module) if params["command"] else None
    try:
        while True:
            now = _monotonic() - start
            rows.extend(sample(now))
            samples += 1
            if command is not None and command.wait(0):
                break
            tick = max(tick + 1, int(math.floor(now / interval)) + 1)
            if command is None and tick * interval > params["duration_s"] + 1e-9:
                break
            wait = start + tick * interval - _monotonic()
            if command is None:
                if wait > 0:
                    _sleep(wait)
                continue
            left = start + params["command_timeout_s"] - _monotonic()
            if command.wait(max(0.0, min(wait, left))):
                break
            if left <= wait:
                timed_out = True
                command.kill()
                break
    finally:
        if command is not None and not command.wait(0):
            command.kill()
    elapsed = _monotonic() - start
    if command is None:
        return rows, samples, elapsed, None
    # No result: its output was still being read 10 s after the kill (a process it started holds it).
    rc, out, err = command.result if command.result is not None else (command.process.poll(), "", "")
    result = {"rc": rc, "stdout_lines": out.splitlines(), "stderr_lines": err.splitlines(),
              "elapsed_s": round(elapsed, 3), "timed_out": timed_out}
    return rows, samples, elapsed, result


def _nvml_body(notes):
    """The body of run_with_nvml: the trace through NVML."""

    def body(module, nvml):
        found = nvml_gpus(nvml)
        if found["error"] is not None:
            module.fail_json(msg="NVML could not count the GPUs (nvmlDeviceGetCount: %s)" % found["error"],
                             nvml_error=found["error"])
        return _trace(module, lambda time_s: sample_nvml(nvml, found["gpus"], time_s, notes))

    return body


def _smi_sampler(module, failures):
    """A sampler through ``nvidia-smi --query-gpu``; a failed sample after the first is skipped and noted."""
    path = module.get_bin_path("nvidia-smi")
    if path is None:
        module.fail_json(msg="neither the pynvml module (package nvidia-ml-py, for %s) nor nvidia-smi is on this node; "
                             "install the NVIDIA driver's nvidia-smi or nvidia-ml-py" % sys.executable)
    state = {"field": SMI_FIELDS[-1], "first": True}

    def sample(time_s):
        rc, out, err = module.run_command(smi_query_argv(state["field"], path), check_rc=False)
        if rc != 0 and state["field"] != SMI_REASONS_FIELD_OLD and smi_rejected_field(out + err) == state["field"]:
            # A driver before R535 knows the field by its old name.
            state["field"] = SMI_REASONS_FIELD_OLD
            rc, out, err = module.run_command(smi_query_argv(state["field"], path), check_rc=False)
        lost = "\n".join(line for line in err.splitlines() if smi_lost_gpu(line))
        try:
            rows = parse_smi_query(out, time_s) + parse_smi_query(lost, time_s)
        except ValueError as error:
            rows, problem = [], "%s" % error
        else:
            # A lost GPU makes nvidia-smi exit non-zero after the lines of the others.
            problem = None if rows or rc == 0 else "no GPU line"
        if problem is not None and rc != 0:
            said = (out.strip() or err.strip()).splitlines()
            problem = "nvidia-smi --query-gpu failed (rc %d): %s" % (rc, said[0] if said else "no output")
        elif problem is not None:
            problem = "nvidia-smi --query-gpu printed what is not its CSV output: %s" % problem
        first, state["first"] = state["first"], False
        if problem is None:
            return rows
        if first:
            module.fail_json(msg=problem, rc=rc)
        failures.append(problem)
        return []

    return sample


def _unique(notes):
    seen = []
    for note in notes:
        if note not in seen:
            seen.append(note)
    return seen


def main():
    module = AnsibleModule(
        argument_spec=dict(
            duration_s=dict(type="float", default=5.0),
            interval_s=dict(type="float", default=0.5),
            command=dict(type="list", elements="str"),
            command_timeout_s=dict(type="float", default=3600.0),
            source=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia_smi"]),
            baseline=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    _check_params(module)
    source = module.params["source"]
    nvml = load_pynvml() if source in ("auto", "nvml") else None
    if source == "nvml" and nvml is None:
        module.fail_json(msg="source=nvml was asked for, but the pynvml module (package nvidia-ml-py) cannot be "
                             "imported by %s on this node; install nvidia-ml-py or use source=auto" % sys.executable)
    notes = []
    failures = []
    if nvml is not None:
        source = "nvml"
        rows, samples, elapsed, command = run_with_nvml(module, nvml, _nvml_body(notes))
    else:
        source = "nvidia_smi"
        rows, samples, elapsed, command = _trace(module, _smi_sampler(module, failures))
    if failures:
        module.warn("%d of %d nvidia-smi samples failed and are left out; the first: %s"
                    % (len(failures), samples, failures[0]))
    result = dict(
        changed=False,
        source=source,
        columns=list(COLUMNS),
        rows=[row_values(row) for row in rows],
        csv=to_csv(rows),
        summary=summarize(rows),
        samples=samples - len(failures),
        duration_s=round(elapsed, 3),
        unsupported=_unique(notes),
    )
    if module.params["baseline"] is not None:
        try:
            result["changes"] = compare(module.params["baseline"], result["summary"])
        except ValueError as exc:
            module.warn("baseline not compared: the option baseline: %s" % str(exc).replace("before: ", "", 1))
            result["changes"] = None
    if command is not None:
        timed_out = command.pop("timed_out")
        result["command"] = command
        name = module.params["command"][0]
        if timed_out:
            module.fail_json(msg="command %s did not exit within command_timeout_s=%g seconds; it was killed, the trace "
                                 "of its first %d samples is returned" % (name, module.params["command_timeout_s"],
                                                                          result["samples"]), **result)
        if command["rc"] != 0:
            module.fail_json(msg="command %s exited with rc %s; the trace of its %d samples is returned"
                             % (name, command["rc"], result["samples"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
