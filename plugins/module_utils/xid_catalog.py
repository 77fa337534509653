# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Xid catalog, kept as data: what each NVIDIA Xid means and what to do about it.

An Xid is a number the NVIDIA kernel driver (``NVRM``) writes to the kernel log when it sees
a GPU error (``NVRM: Xid (PCI:0000:9b:00): 119, ...``). This module maps each number to:

- ``name``: a short name (our words); ``mnemonic``: NVIDIA's mnemonic for the code;
- ``description``: what happened, in our words;
- ``severity``: one of :data:`SEVERITIES`, from least to most serious:
  ``info`` (informational, nothing to do), ``warning`` (an application fault or a corrected /
  contained error; the GPU stays usable), ``critical`` (the GPU needs a reset, or its state is in
  doubt, before it takes more work), ``fatal`` (the GPU is unusable until the node is rebooted or
  the hardware is serviced);
- ``action``: one of :data:`ACTIONS`, the immediate recommended action, from least to most
  disruptive: ``ignore``, ``check_application``, ``reset_gpu``, ``reboot``,
  ``hardware_inspection``;
- ``fatal``: ``True`` when a node showing this Xid must not go back into service as it is and a
  driver rollout must stop there (the rollout's "no new fatal Xid" gate). Every ``reboot`` or
  ``hardware_inspection`` action and every ``fatal`` severity is fatal; some ``critical`` ones
  are too (hardware, firmware or driver faults);
- ``nvidia_immediate`` / ``nvidia_investigatory``: NVIDIA's resolution buckets for the code
  (``RESTART_APP``, ``RESET_GPU``, ``RESTART_BM``, ``CONTACT_SUPPORT``, ``WORKFLOW_...``), as facts;
- ``sources``: where the facts come from;
- ``known``: ``False`` only for the default entry given to a number not in the catalog.

How NVIDIA's immediate bucket becomes our action: ``IGNORE`` → ``ignore``; ``RESTART_APP`` →
``check_application``; ``RESET_GPU`` → ``reset_gpu``; ``RESTART_BM``/``RESTART_VM`` → ``reboot``;
``CONTACT_SUPPORT``/``CHECK_MECHANICALS`` → ``hardware_inspection``; ``WORKFLOW_*`` buckets and
the codes NVIDIA lists as unused on current GPUs are decided per code, noted in ``notes``.
Where this catalog departs from NVIDIA's immediate bucket it says why in ``notes``.

Sources: NVIDIA, "Xid Errors" (https://docs.nvidia.com/deploy/xid-errors/) and its Xid catalog
for Ampere and newer GPUs (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
mnemonics and resolution buckets); the older-GPU Xid table of the same guide (names of codes
NVIDIA now lists as unused); the Xid actions of leptonai/gpud
(https://github.com/leptonai/gpud, components/accelerator/nvidia/xid); and the field cases
under tests/fixtures/cases (06, 08, 09). Pure data and functions, no I/O; Python 3.7+.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Dict, Optional, Tuple

AS_OF = "2026-11-29"

#: Severities of an Xid event, least to most serious (the one scale of kernel-log events; a drift
#: finding has its own, drift.FINDING_SEVERITIES).
SEVERITIES = ("info", "warning", "critical", "fatal")
ACTIONS = ("ignore", "check_application", "reset_gpu", "reboot", "hardware_inspection")

NVIDIA_XID_PAGE = "https://docs.nvidia.com/deploy/xid-errors/"
NVIDIA_XID_CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
GPUD_XID = "https://github.com/leptonai/gpud (components/accelerator/nvidia/xid)"

_BASE_SOURCES = (NVIDIA_XID_PAGE, NVIDIA_XID_CATALOG)


def _entry(name: str, mnemonic: str, description: str, severity: str, action: str, fatal: bool,
           immediate: str, investigatory: str, notes: str = "",
           extra_sources: Tuple[str, ...] = ()) -> Dict[str, Any]:
    return {
        "name": name,
        "mnemonic": mnemonic,
        "description": description,
        "severity": severity,
        "action": action,
        "fatal": fatal,
        "nvidia_immediate": immediate,
        "nvidia_investigatory": investigatory,
        "notes": notes,
        "sources": list(_BASE_SOURCES) + list(extra_sources),
        "known": True,
    }


_NVLINK5 = (
    "NVLink5 (Blackwell) error. The driver prints 'Fatal' or 'Nonfatal' after the unit name; "
    "classify() reads it: Nonfatal -> warning/ignore, Fatal -> critical/reset_gpu. NVIDIA's "
    "'XID 144-150 Decode' table refines this per unit and error status. Without the word the "
    "entry stays conservative (critical, reset_gpu, fatal)."
)

XID_CATALOG = {
    8: _entry(
        "GPU stopped processing (channel idle timeout)", "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "A channel stopped making progress and the driver timed it out; usually the work "
        "submitted by the application, sometimes a driver problem.",
        "warning", "check_application", False, "RESTART_APP", "CONTACT_SUPPORT"),
    13: _entry(
        "Graphics engine exception", "ROBUST_CHANNEL_GR_EXCEPTION",
        "The graphics/compute engine raised an exception (illegal instruction, out-of-range "
        "access, warp error) while running a kernel; almost always a fault of the application.",
        "warning", "check_application", False, "RESTART_APP", "WORKFLOW_XID_13",
        "Several lines in the same second are one exception (field case 08).",
        (GPUD_XID,)),
    31: _entry(
        "GPU memory page fault", "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "The GPU's MMU refused an access to an unmapped or protected address; usually an "
        "application bug (bad pointer), rarely a driver or hardware fault.",
        "warning", "check_application", False, "RESTART_APP", "WORKFLOW_XID_31",
        "If it repeats with different applications on the same GPU, look at the hardware.",
        (GPUD_XID,)),
    32: _entry(
        "Corrupted push buffer stream", "ROBUST_CHANNEL_PBDMA_ERROR",
        "The command stream fetched by the GPU was invalid or corrupted.",
        "warning", "check_application", False, "RESTART_APP", "CHECK_APP/CUDA"),
    38: _entry(
        "Driver firmware error (watchdog timeout)", "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT",
        "A firmware watchdog inside the GPU expired; the driver recovers on its own.",
        "warning", "ignore", False, "IGNORE", "CONTACT_SUPPORT",
        "Recurrence on one GPU is worth a support case."),
    43: _entry(
        "GPU stopped processing (channel reset)", "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "The driver stopped and reset a channel after a fault of the application using it; "
        "the GPU stays healthy.",
        "warning", "check_application", False, "IGNORE", "CONTACT_SUPPORT",
        "NVIDIA's immediate bucket is IGNORE for the GPU; the application that owned the "
        "channel did fail, so it is attributed to the application (as gpud does).",
        (GPUD_XID,)),
    44: _entry(
        "Graphics engine fault during context switch", "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
        "The graphics/compute engine faulted while switching between contexts.",
        "warning", "ignore", False, "IGNORE", "CONTACT_SUPPORT",
        "Repeated occurrences call for a GPU reset and a support case."),
    45: _entry(
        "Preemptive cleanup after earlier errors", "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "The driver tore down channels because of an earlier error (often an ECC error or an "
        "application killed on another Xid); a follow-on event, not a cause.",
        "warning", "ignore", False, "WORKFLOW_XID_45", "WORKFLOW_XID_45",
        "Follow the Xid it accompanies. Alone on an NVSwitch system, NVIDIA suggests "
        "restarting the fabric manager.", (GPUD_XID,)),
    46: _entry(
        "GPU stopped processing (GPU timeout)", "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        "The GPU stopped answering the driver within its timeout.",
        "critical", "reset_gpu", False, "RESET_GPU", "CONTACT_SUPPORT"),
    48: _entry(
        "Double-bit ECC error", "ROBUST_CHANNEL_GPU_ECC_DBE",
        "An uncorrectable (double-bit) ECC error in GPU memory. Applications using the GPU are "
        "stopped; on GPUs with row remapping a remap is recorded and needs a GPU reset.",
        "critical", "reset_gpu", True, "WORKFLOW_XID_48", "WORKFLOW_XID_48",
        "Read remapped rows / retired pages (NVML) after the reset; a failed remap (Xid 64) "
        "or repeats mean hardware inspection.", (GPUD_XID,)),
    54: _entry(
        "Auxiliary power not connected", "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "The board's auxiliary power connector is not supplying power; the GPU runs at "
        "reduced clocks.",
        "critical", "hardware_inspection", True, "CHECK_MECHANICALS", "CONTACT_SUPPORT"),
    56: _entry(
        "Display engine error", "DISPLAY_CHANNEL_EXCEPTION",
        "The display engine reported an error (older GPUs; NVIDIA lists the code as unused on "
        "Ampere and newer).",
        "critical", "reset_gpu", False, "CONTACT_SUPPORT", "",
        "Compute work does not use the display engine; a GPU reset clears it. Our judgement, "
        "as NVIDIA gives no bucket beyond contacting support."),
    57: _entry(
        "Video memory interface programming error", "FB_LINK_TRAINING_FAILURE_ERROR",
        "The driver failed to program or train the GPU memory interface (older GPUs; unused on "
        "Ampere and newer).",
        "critical", "hardware_inspection", True, "CONTACT_SUPPORT", ""),
    61: _entry(
        "Internal micro-controller breakpoint or warning", "PMU_BREAKPOINT",
        "The GPU's power-management micro-controller hit a breakpoint or raised a warning "
        "(older drivers; unused on Ampere and newer).",
        "critical", "reboot", True, "CONTACT_SUPPORT", "",
        "gpud reboots, and inspects the hardware if it comes back.", (GPUD_XID,)),
    62: _entry(
        "Internal micro-controller halt", "PMU_HALT_ERROR",
        "The GPU's power-management micro-controller halted.",
        "critical", "reset_gpu", True, "RESET_GPU", "CONTACT_SUPPORT",
        "A halted micro-controller leaves power and thermal management in doubt; repeats mean "
        "hardware inspection.", (GPUD_XID,)),
    63: _entry(
        "Memory row remapping / page retirement recorded", "INFOROM_DRAM_RETIREMENT_EVENT",
        "The GPU recorded a memory row for remapping (Ampere and newer) or a page for "
        "retirement (older GPUs). It takes effect only after a GPU reset ('reset gpu to "
        "activate').",
        "warning", "reset_gpu", False, "IGNORE", "IGNORE",
        "NVIDIA ignores the event itself; the pending remap is what needs the reset, and NVML "
        "remapped rows (pending) is the authoritative reading (field cases 04, 09).",
        (GPUD_XID,)),
    64: _entry(
        "Memory row remapping / page retirement failure", "INFOROM_DRAM_RETIREMENT_FAILURE",
        "The GPU could not record a memory row remapping or page retirement: a memory error it "
        "can no longer repair.",
        "fatal", "hardware_inspection", True, "RESET_GPU", "CONTACT_SUPPORT",
        "NVIDIA's immediate bucket is RESET_GPU; a node with this Xid is kept out of the pool "
        "until the GPU is inspected (field case 09, NVIDIA's memory-error RMA policy).",
        (GPUD_XID,)),
    68: _entry(
        "Video decoder (NVDEC0) exception", "ROBUST_CHANNEL_NVDEC0_ERROR",
        "The video decode engine raised an exception.",
        "warning", "check_application", False, "RESTART_APP", "CONTACT_SUPPORT"),
    69: _entry(
        "Graphics engine class error", "ROBUST_CHANNEL_GR_CLASS_ERROR",
        "The graphics/compute engine received a method it does not accept for the object class.",
        "warning", "check_application", False, "RESTART_APP", "CHECK_APP/CUDA"),
    74: _entry(
        "NVLink error", "NVLINK_ERROR",
        "An NVLink connection of this GPU reported an error.",
        "critical", "reset_gpu", True, "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT",
        "NVIDIA's workflow decodes the register values in the message; without that, treat "
        "the link as suspect: reset the GPU and inspect the hardware if it repeats.",
        (GPUD_XID,)),
    79: _entry(
        "GPU has fallen off the bus", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "The GPU stopped answering on PCIe; the driver can no longer reach it.",
        "fatal", "reboot", True, "RESTART_BM", "CONTACT_SUPPORT",
        "Also logged without a number ('GPU has fallen off the bus'); counted as Xid 79. "
        "Inspect the hardware (seating, power, riser, thermals) if it comes back.",
        (GPUD_XID,)),
    92: _entry(
        "High single-bit ECC error rate", "EXCESSIVE_SBE_INTERRUPTS",
        "Many corrected (single-bit) ECC errors in a short time; they were corrected.",
        "warning", "ignore", False, "IGNORE", "CONTACT_SUPPORT", "", (GPUD_XID,)),
    94: _entry(
        "Contained memory error", "ROBUST_CHANNEL_CONTAINED_ERROR",
        "An uncorrectable memory error was contained to the applications using the bad memory; "
        "they were stopped, other work continues.",
        "warning", "check_application", False, "RESTART_APP", "IGNORE (sympathetic)",
        "The affected application must restart; a row remap is then pending until the next "
        "GPU reset.", (GPUD_XID,)),
    95: _entry(
        "Uncontained memory error", "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "An uncorrectable memory error could not be contained; all work on the GPU is affected.",
        "critical", "reset_gpu", True, "RESET_GPU", "IGNORE (sympathetic)",
        "gpud reboots, then inspects the hardware if it repeats.", (GPUD_XID,)),
    109: _entry(
        "Context switch timeout", "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "The GPU did not finish a context switch in time.",
        "critical", "reset_gpu", False, "RESET_GPU", "CONTACT_SUPPORT",
        "Often follows an application fault on the same GPU (field case 08); not fatal for a "
        "rollout by itself, but the GPU needs a reset.", (GPUD_XID,)),
    119: _entry(
        "GSP RPC timeout", "GSP_RPC_TIMEOUT",
        "The GPU System Processor (GSP) firmware did not answer a driver call in time.",
        "critical", "reset_gpu", True, "RESET_GPU", "INVESTIGATE_SW",
        "A firmware / driver-path fault: right after a driver upgrade it is a rollback signal "
        "(field case 06). The driver may rate-limit these prints.", (GPUD_XID,)),
    120: _entry(
        "GSP error", "GSP_ERROR",
        "The GPU System Processor (GSP) firmware reported an error.",
        "critical", "reset_gpu", True, "RESET_GPU", "INVESTIGATE_SW", "", (GPUD_XID,)),
    121: _entry(
        "C2C link error", "C2C_ERROR",
        "The chip-to-chip (C2C) link between CPU and GPU (Grace Hopper / Grace Blackwell) "
        "reported an error that was corrected.",
        "warning", "ignore", False, "IGNORE", "CONTACT_SUPPORT", "", (GPUD_XID,)),
    122: _entry(
        "SPI PMU RPC read failure", "SPI_PMU_RPC_READ_FAIL",
        "A read from the board's SPI flash through the power-management unit failed.",
        "critical", "hardware_inspection", True, "CONTACT_SUPPORT", ""),
    123: _entry(
        "SPI PMU RPC write failure", "SPI_PMU_RPC_WRITE_FAIL",
        "A write to the board's SPI flash through the power-management unit failed.",
        "critical", "hardware_inspection", True, "CONTACT_SUPPORT", ""),
    136: _entry(
        "NVLink training failed", "ALI_TRAINING_FAIL",
        "An NVLink connection failed to train.",
        "critical", "reset_gpu", True, "RESET_GPU", "INVESTIGATE_LINK_SI"),
    140: _entry(
        "Unrecovered ECC error", "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "An ECC error escaped correction and containment.",
        "critical", "reset_gpu", True, "RESET_GPU", "CONTACT_SUPPORT", "", (GPUD_XID,)),
    143: _entry(
        "GPU initialization failure", "GPU_INIT_ERROR",
        "The GPU failed to initialize.",
        "fatal", "hardware_inspection", True, "RESET_GPU", "CONTACT_SUPPORT",
        "NVIDIA's immediate bucket is RESET_GPU; a GPU that does not initialize is kept out of "
        "service until inspected (as gpud does).", (GPUD_XID,)),
    144: _entry("NVLink SAW error", "NVLINK_SAW_ERROR",
                "The NVLink SAW unit reported an error.",
                "critical", "reset_gpu", True, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                _NVLINK5, (GPUD_XID,)),
    145: _entry("NVLink RLW error", "NVLINK_RLW_ERROR",
                "The NVLink RLW unit reported an error.",
                "critical", "reset_gpu", True, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                _NVLINK5, (GPUD_XID,)),
    146: _entry("NVLink TLW error", "NVLINK_TLW_ERROR",
                "The NVLink TLW unit reported an error.",
                "critical", "reset_gpu", True, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                _NVLINK5, (GPUD_XID,)),
    147: _entry("NVLink TREX error", "NVLINK_TREX_ERROR",
                "The NVLink TREX unit reported an error.",
                "critical", "reset_gpu", True, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                _NVLINK5, (GPUD_XID,)),
    148: _entry("NVLink NVLPW control error", "NVLINK_NVLPW_CTRL_ERROR",
                "The NVLink NVLPW control unit reported an error.",
                "critical", "reset_gpu", True, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                _NVLINK5, (GPUD_XID,)),
    149: _entry("NVLink NETIR error", "NVLINK_NETIR_ERROR",
                "The NVLink NETIR unit reported an error (link events, bit error rate).",
                "critical", "reset_gpu", True, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                _NVLINK5, (GPUD_XID,)),
    150: _entry("NVLink MSE error", "NVLINK_MSE_ERROR",
                "The NVLink MSE unit reported an error (for example its watchdog).",
                "critical", "reset_gpu", True, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR",
                _NVLINK5, (GPUD_XID,)),
    154: _entry(
        "GPU recovery action changed", "GPU_RECOVERY_ACTION_CHANGED",
        "The driver states which recovery the GPU now needs, after another Xid "
        "('GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)').",
        "info", "ignore", False, "XID_154", "N/A (informational, about another Xid)",
        "classify() reads the new recovery action from the message: None -> ignore; GPU Reset "
        "Required / Drain P2P / Drain and Reset -> reset_gpu; Node Reboot Required -> reboot.",
        (GPUD_XID,)),
    155: _entry(
        "NVLink software-defined error", "NVLINK_SW_DEFINED_ERROR",
        "The driver flagged an NVLink error condition defined in software.",
        "critical", "reset_gpu", False, "RESET_GPU", "INVESTIGATE_SW_USER"),
    158: _entry(
        "GPU fatal timeout", "GPU_FATAL_TIMEOUT",
        "The GPU hit a timeout the driver treats as fatal for its current state.",
        "critical", "reset_gpu", True, "RESET_GPU", "CONTACT_SUPPORT"),
}

_UNKNOWN_NOTES = (
    "Not in this catalog (as of %s). Read the message and NVIDIA's catalog; treated as a "
    "warning that needs a look at the application, not as a rollout stopper." % AS_OF
)

# Xid 154 recovery actions, code -> (words the driver prints, severity, action, fatal).
# Source: NVIDIA Xid catalog, Xid 154 and its linkage column; driver messages quoted in public
# reports ("to 0x1 (GPU Reset Required)", "to 0x2 (Node Reboot Required)", "0x2 (OS Reboot)").
_RECOVERY_ACTIONS = {
    0: ("none", "info", "ignore", False),
    1: ("gpu reset required", "critical", "reset_gpu", False),
    2: ("node reboot required", "fatal", "reboot", True),
    3: ("drain p2p", "critical", "reset_gpu", False),
    4: ("drain and reset", "critical", "reset_gpu", False),
}
_RECOVERY_WORDS = {
    "none": 0,
    "gpu reset required": 1,
    "pf flr": 1,
    "gpu reset": 1,
    "node reboot required": 2,
    "os reboot": 2,
    "reboot": 2,
    "drain p2p": 3,
    "drain and reset": 4,
}
_RECOVERY_RE = re.compile(r"recovery action changed from .*?\bto\s+(0x[0-9a-fA-F]+|\d+)\s*(?:\(([^)]*)\))?",
                          re.IGNORECASE)
_NVLINK5_RE = re.compile(r"\b(Nonfatal|Non-fatal|Fatal)\b", re.IGNORECASE)


def _unknown(xid: int) -> Dict[str, Any]:
    entry = _entry("Unknown Xid %d" % xid, "", "An Xid this catalog does not list.",
                   "warning", "check_application", False, "", "", _UNKNOWN_NOTES)
    entry["known"] = False
    return entry


def _refine_154(entry: Dict[str, Any], message: str) -> None:
    match = _RECOVERY_RE.search(message)
    if not match:
        return
    code = None
    words = (match.group(2) or "").strip().lower()
    if words in _RECOVERY_WORDS:
        code = _RECOVERY_WORDS[words]
    else:
        number = int(match.group(1), 0)
        if number in _RECOVERY_ACTIONS:
            code = number
    if code is None:
        entry["severity"], entry["action"], entry["fatal"] = "critical", "reset_gpu", False
        entry["recovery_action"] = words or match.group(1)
        return
    _words, severity, action, fatal = _RECOVERY_ACTIONS[code]
    entry["severity"], entry["action"], entry["fatal"] = severity, action, fatal
    entry["recovery_action"] = words or _words


def _refine_nvlink5(entry: Dict[str, Any], message: str) -> None:
    match = _NVLINK5_RE.search(message)
    if not match:
        return
    if match.group(1).lower().startswith("non"):
        entry["severity"], entry["action"], entry["fatal"] = "warning", "ignore", False
    else:
        entry["severity"], entry["action"], entry["fatal"] = "critical", "reset_gpu", True


def classify(xid: int, message: Optional[str] = None) -> Dict[str, Any]:
    """Classify one Xid number, optionally refined by the text the driver printed with it.

    :param xid: the Xid number (``int``, or text of digits).
    :param message: the text after the number in the ``NVRM: Xid`` line, or ``None``. Used for
        Xid 154 (the new recovery action it names) and Xids 144-150 (the driver's
        ``Fatal``/``Nonfatal`` word); ignored for every other Xid.
    :returns: a new dict ``{xid, name, mnemonic, description, severity, action, fatal,
        nvidia_immediate, nvidia_investigatory, notes, sources, known}`` (plus
        ``recovery_action``, lower-case words, for a refined Xid 154). ``severity`` is one of
        :data:`SEVERITIES`, ``action`` one of :data:`ACTIONS`. A number not in
        :data:`XID_CATALOG` gets a default entry (``known: False``, severity ``warning``,
        action ``check_application``, not fatal) instead of an error.
    :raises ValueError: when ``xid`` is not an integer (or text of one).
    Source: :data:`XID_CATALOG` (NVIDIA Xid catalog, see the module docstring).
    """
    number = int(xid)
    base = XID_CATALOG.get(number)
    entry = copy.deepcopy(base) if base is not None else _unknown(number)
    entry["xid"] = number
    if message:
        if number == 154:
            _refine_154(entry, message)
        elif 144 <= number <= 150:
            _refine_nvlink5(entry, message)
    return entry


def severity_rank(severity: Optional[str]) -> int:
    """Rank of a severity in :data:`SEVERITIES` (``info`` 0 … ``fatal`` 3); -1 for ``None``/unknown."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


def action_rank(action: Optional[str]) -> int:
    """Rank of an action in :data:`ACTIONS` (``ignore`` 0 … ``hardware_inspection`` 4); -1 for ``None``/unknown."""
    return ACTIONS.index(action) if action in ACTIONS else -1
