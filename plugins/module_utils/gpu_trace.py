# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evidence trace of a driver update: a short time series per GPU, before and after it.

A trace is a list of rows, one per GPU and sampling instant, each a dict with the keys of
:data:`COLUMNS`:

============================ ====== ==============================================================
column                       unit   source (NVML call; ``nvidia-smi --query-gpu`` field)
============================ ====== ==============================================================
``time_s``                   s      seconds since the trace started (3 decimals)
``gpu``                      —      the NVML device index; ``index``
``pci_bus_id``               —      nvmlDeviceGetPciInfo ``.busId`` (``"0000:18:00.0"``); ``pci.bus_id``
``uuid``                     —      nvmlDeviceGetUUID; ``uuid``
``pstate``                   —      nvmlDeviceGetPerformanceState (``"P0"`` ... ``"P15"``); ``pstate``
``sm_clock_mhz``             MHz    nvmlDeviceGetClockInfo(NVML_CLOCK_SM); ``clocks.sm``
``mem_clock_mhz``            MHz    nvmlDeviceGetClockInfo(NVML_CLOCK_MEM); ``clocks.mem``
``power_w``                  W      nvmlDeviceGetPowerUsage (mW, 1 decimal in W); ``power.draw``
``temperature_c``            °C     nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU); ``temperature.gpu``
``utilization_gpu_pct``      %      nvmlDeviceGetUtilizationRates ``.gpu``; ``utilization.gpu``
``clocks_event_reasons``     —      nvmlDeviceGetCurrentClocksEventReasons (...ThrottleReasons before
                                    R535); ``clocks_event_reasons.active``
                                    (``clocks_throttle_reasons.active`` before R535)
============================ ====== ==============================================================

In a row dict ``clocks_event_reasons`` is a list of the names of
:data:`facts_model.CLOCKS_EVENT_REASON_BITS` (``[]`` when no reason is active); in the flat forms
(:func:`row_values`, :func:`to_csv`) the names are joined with ``|`` and no active reason is
``none`` (NVML's ``nvmlClocksEventReasonNone``). A value the source could not give is ``None``
(an empty CSV cell), never 0.

- :func:`nvml_gpus` and :func:`sample_nvml` read the rows of one instant through NVML;
- :func:`smi_query_argv` and :func:`parse_smi_query` do it through ``nvidia-smi --query-gpu``;
- :func:`check_rows`, :func:`row_values` and :func:`to_csv` turn rows (also untrusted ones read
  back from a file) into typed rows, flat lists and CSV text;
- :func:`summarize` and :func:`compare` reduce a trace per GPU and say what moved between the
  trace before and the trace after an update (docs/contract.md, "Evidence: GPU traces").

Standard library only; only :func:`nvml_gpus` and :func:`sample_nvml` do I/O (through the NVML
object they are given). Compatible with Python 3.7.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import (
    CLOCKS_EVENT_REASON_BITS,
    clocks_event_reason_names,
    normalize_pci_bus_id,
    null_if_na,
    performance_state_name,
    watts_from_milliwatts,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import nvml_error_name

COLUMNS = ("time_s", "gpu", "pci_bus_id", "uuid", "pstate", "sm_clock_mhz", "mem_clock_mhz", "power_w",
           "temperature_c", "utilization_gpu_pct", "clocks_event_reasons")

# The measured columns: what a lost GPU has none of.
VALUE_COLUMNS = COLUMNS[4:]

# nvidia-smi --query-gpu fields of COLUMNS[1:], in order. Source: `nvidia-smi --help-query-gpu` of
# drivers R535 to R580; the clocks event reasons field was clocks_throttle_reasons.active before R535.
SMI_FIELDS = ("index", "pci.bus_id", "uuid", "pstate", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu",
              "utilization.gpu", "clocks_event_reasons.active")
SMI_REASONS_FIELD_OLD = "clocks_throttle_reasons.active"

# A value counts as moved in compare() when it changed by more than the greater of these two: 2 % of
# the value before, and 1 unit of the value (1 MHz, 1 W, 1 °C, 1 percentage point of utilization).
MOVE_RELATIVE = 0.02
MOVE_ABSOLUTE = 1.0
# The share of samples with a clocks event reason moved when it changed by more than 10 points.
MOVE_REASON_SHARE = 0.10

_INT_COLUMNS = ("gpu", "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "utilization_gpu_pct")
_PSTATE = re.compile(r"^P(\d{1,2})$")
_REASON_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_SMI_LOST = re.compile(r"^Unable to determine the device handle for GPU\s*([0-9A-Fa-f]+:[0-9A-Fa-f:.]+)\s*:")
_SMI_BAD_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


class _GpuLost(Exception):
    """NVML said GpuIsLost in the middle of one GPU's sample."""


# --------------------------------------------------------------------------------------------
# Cells and rows
# --------------------------------------------------------------------------------------------

def _number(value: Any) -> Optional[float]:
    """A finite number from an int, a float or a numeric text; ``None`` for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            return None
    elif isinstance(value, str):
        text = null_if_na(value)
        if text is None:
            return None
        try:
            number = float(text)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _int(value: Any) -> Optional[int]:
    number = _number(value)
    return None if number is None else int(round(number))


def _text(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    return null_if_na(value)


def _pstate(value: Any) -> Optional[str]:
    """``"P2"`` or an ``nvmlPstates_t`` integer → ``"P2"``; ``None`` for unknown (32) or anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return performance_state_name(value)
    text = _text(value)
    match = _PSTATE.match(text or "")
    return performance_state_name(int(match.group(1))) if match else None


def _reasons(value: Any) -> Optional[List[str]]:
    """Clocks event reasons from any form a row may hold them in.

    A list of names, a ``|``-joined text (``none`` is no reason), an NVML bit mask (``int``) or
    nvidia-smi's hex mask (``"0x0000000000000004"``) → sorted names (bit order of the reason
    table); ``None`` for an empty cell or anything else. Names that are no lower_snake_case word
    are left out.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return clocks_event_reason_names(value) if value >= 0 else None
    if isinstance(value, (list, tuple)):
        names = [name for name in value if isinstance(name, str) and _REASON_NAME.match(name)]
    elif isinstance(value, str) and value.strip().lower() == "none":
        names = []  # null_if_na would take this word for an empty cell
    else:
        text = _text(value)
        if text is None:
            return None
        if text.lower().startswith("0x"):
            try:
                return clocks_event_reason_names(int(text, 16))
            except ValueError:
                return None
        names = [name for name in text.split("|") if _REASON_NAME.match(name)]
    return sorted(set(names), key=_reason_order)


def _reason_order(name: str) -> tuple:
    """Sort key of a reason name: bit order of the reason table, unknown names after, by name."""
    order = [known for _bit, known in CLOCKS_EVENT_REASON_BITS]
    return (order.index(name) if name in order else len(order), name)


def new_row(time_s: float = 0.0, gpu: Optional[int] = None, pci_bus_id: Optional[str] = None,
            uuid: Optional[str] = None) -> Dict[str, Any]:
    """An empty row for one GPU at one instant: every measured value ``None``.

    :param time_s: seconds since the trace started (rounded to 3 decimals).
    :param gpu: the device index. :param pci_bus_id: normalised here (``"0000:18:00.0"``).
    :param uuid: the GPU UUID.
    :returns: a dict with the keys of :data:`COLUMNS`.
    """
    row = dict.fromkeys(COLUMNS)  # type: Dict[str, Any]
    row["time_s"] = round(float(time_s), 3)
    row["gpu"] = gpu
    row["pci_bus_id"] = normalize_pci_bus_id(pci_bus_id) if pci_bus_id else None
    row["uuid"] = uuid
    return row


def check_row(row: Any, number: int = 0) -> Dict[str, Any]:
    """Type one row, which may come from a file: a dict (missing keys are ``None``) or a list in COLUMNS order.

    :param row: the row. :param number: its position, for the error message.
    :returns: the row dict of :func:`new_row`, every cell typed (a cell that is not a number where
        a number belongs, not a P-state or no reason list is ``None``).
    :raises ValueError: when ``row`` is neither a mapping nor a list of len(COLUMNS) values.
    """
    if isinstance(row, Mapping):
        cells = [row.get(column) for column in COLUMNS]
    elif isinstance(row, (list, tuple)) and len(row) == len(COLUMNS):
        cells = list(row)
    else:
        raise ValueError("trace row %d is not a row: expected a mapping with the keys %s or a list of %d values "
                         "in that order, got %s" % (number, ", ".join(COLUMNS), len(COLUMNS), _shape(row)))
    raw = dict(zip(COLUMNS, cells))
    time_s = _number(raw["time_s"])
    checked = new_row(time_s or 0.0, _int(raw["gpu"]), _text(raw["pci_bus_id"]), _text(raw["uuid"]))
    if time_s is None:
        checked["time_s"] = None
    checked["pstate"] = _pstate(raw["pstate"])
    for column in _INT_COLUMNS[1:]:
        checked[column] = _int(raw[column])
    power = _number(raw["power_w"])
    checked["power_w"] = None if power is None else round(power, 1)
    checked["clocks_event_reasons"] = _reasons(raw["clocks_event_reasons"])
    return checked


def _shape(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "a list of %d values" % len(value)
    return "a %s" % type(value).__name__


def check_rows(rows: Any) -> List[Dict[str, Any]]:
    """Type every row of a trace (:func:`check_row`).

    :param rows: a list of row dicts or of lists in COLUMNS order (the module's ``rows``).
    :returns: the typed row dicts, in order.
    :raises ValueError: when ``rows`` is not a list, or one row is not a row.
    """
    if not isinstance(rows, (list, tuple)):
        raise ValueError("a trace is a list of rows (dicts, or lists of the values of %s), got %s"
                         % (", ".join(COLUMNS), _shape(rows)))
    return [check_row(row, number) for number, row in enumerate(rows)]


def row_values(row: Mapping[str, Any]) -> List[Any]:
    """One typed row as a list in COLUMNS order, reasons joined with ``|`` (``"none"`` for no reason).

    :param row: a row dict (:func:`check_row` form).
    :returns: ``[time_s, gpu, pci_bus_id, uuid, pstate, sm_clock_mhz, mem_clock_mhz, power_w,
        temperature_c, utilization_gpu_pct, "gpu_idle|sw_power_cap"]``; unknown values ``None``.
    """
    values = [row.get(column) for column in COLUMNS]
    reasons = row.get("clocks_event_reasons")
    values[-1] = None if reasons is None else ("|".join(reasons) if reasons else "none")
    return values


def to_csv(rows: Any) -> str:
    """The trace as CSV text: a header line of COLUMNS, then one line per row (``\\n`` line ends).

    :param rows: as :func:`check_rows` takes them.
    :returns: the text; ``None`` is an empty cell, ``time_s`` has 3 decimals and ``power_w`` 1.
    :raises ValueError: as :func:`check_rows`.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in check_rows(rows):
        values = row_values(row)
        if values[0] is not None:
            values[0] = "%.3f" % values[0]
        if values[7] is not None:
            values[7] = "%.1f" % values[7]
        writer.writerow(["" if value is None else value for value in values])
    return out.getvalue()


# --------------------------------------------------------------------------------------------
# NVML
# --------------------------------------------------------------------------------------------

def _call(nvml: Any, func_name: str, *args: Any) -> Any:
    """Call one NVML function; ``(value, None)`` or ``(None, error name)``. Other exceptions propagate."""
    try:
        return getattr(nvml, func_name)(*args), None
    except Exception as err:  # pylint: disable=broad-except
        name = nvml_error_name(nvml, err)
        if name is None:
            raise
        return None, name


def _identity(nvml: Any, handle: Any) -> Dict[str, Any]:
    pci, _error = _call(nvml, "nvmlDeviceGetPciInfo", handle)
    uuid, _error = _call(nvml, "nvmlDeviceGetUUID", handle)
    return {"pci_bus_id": normalize_pci_bus_id(_text(getattr(pci, "busId", None))), "uuid": _text(uuid)}


def nvml_gpus(nvml: Any) -> Dict[str, Any]:
    """The GPUs to sample, identified once (NVML already initialised). Does NVML I/O.

    :param nvml: the pynvml module (nvidia-ml-py) or an object with its functions.
    :returns: ``{"gpus": [{"index": int, "handle": NVML handle or None, "pci_bus_id": str | None,
        "uuid": str | None, "error": NVML error name of nvmlDeviceGetHandleByIndex or None}],
        "error": NVML error name of nvmlDeviceGetCount or None}``; a GPU whose handle NVML will not
        give (GpuIsLost) keeps its index, with ``handle`` ``None``.
    :raises: nothing for NVML errors; other exceptions propagate.

    Calls: nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetPciInfo (``busId``),
    nvmlDeviceGetUUID.
    """
    count, error = _call(nvml, "nvmlDeviceGetCount")
    gpus = []
    for index in range(count or 0):
        handle, handle_error = _call(nvml, "nvmlDeviceGetHandleByIndex", index)
        gpu = {"index": index, "handle": handle, "pci_bus_id": None, "uuid": None, "error": handle_error}
        if handle is not None:
            gpu.update(_identity(nvml, handle))
        gpus.append(gpu)
    return {"gpus": gpus, "error": error}


def _read(nvml: Any, handle: Any, gpu: Any, column: str, calls: Sequence[tuple], notes: Optional[list]) -> Any:
    """The first of ``calls`` (``(func_name, args)``) that answers; ``None`` and a note when none does."""
    error = None
    for func_name, args in calls:
        value, error = _call(nvml, func_name, handle, *args)
        if error == "GpuIsLost":
            raise _GpuLost()
        if error is None:
            return value
    if notes is not None:
        notes.append({"gpu": gpu, "column": column, "call": calls[-1][0], "error": error})
    return None


def _measure(nvml: Any, handle: Any, index: Any, row: Dict[str, Any], notes: Optional[list]) -> None:
    """Fill the measured values of one GPU's row; raises _GpuLost."""

    def get(column: str, func_name: str, *args: Any) -> Any:
        return _read(nvml, handle, index, column, [(func_name, args)], notes)

    row["pstate"] = _pstate(get("pstate", "nvmlDeviceGetPerformanceState"))
    row["sm_clock_mhz"] = _int(get("sm_clock_mhz", "nvmlDeviceGetClockInfo", getattr(nvml, "NVML_CLOCK_SM", 1)))
    row["mem_clock_mhz"] = _int(get("mem_clock_mhz", "nvmlDeviceGetClockInfo", getattr(nvml, "NVML_CLOCK_MEM", 2)))
    milliwatts = _int(get("power_w", "nvmlDeviceGetPowerUsage"))
    row["power_w"] = None if milliwatts is None else round(watts_from_milliwatts(milliwatts), 1)
    row["temperature_c"] = _int(get("temperature_c", "nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0)))
    row["utilization_gpu_pct"] = _int(getattr(get("utilization_gpu_pct", "nvmlDeviceGetUtilizationRates"), "gpu", None))
    mask = _read(nvml, handle, index, "clocks_event_reasons", [("nvmlDeviceGetCurrentClocksEventReasons", ()),
                                                               ("nvmlDeviceGetCurrentClocksThrottleReasons", ())], notes)
    row["clocks_event_reasons"] = _reasons(mask) if isinstance(mask, int) else None


def sample_nvml(nvml: Any, handles: Sequence[Any], time_s: float = 0.0,
                notes: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """The rows of one instant, one per GPU, read through NVML (already initialised). Does NVML I/O.

    :param nvml: the pynvml module (nvidia-ml-py) or an object with its functions.
    :param handles: the GPUs, as :func:`nvml_gpus` returns them in ``gpus`` (their identity is
        not read again), or bare NVML device handles (index = position; identity read now).
    :param time_s: seconds since the trace started, for every row.
    :param notes: a list that gets ``{gpu, column, call, error}`` for each value NVML would not
        give (``NotSupported``, ``NoPermission``, ``FunctionNotFound``, ``GpuIsLost``, ...).
    :returns: one row dict (:func:`new_row`) per entry of ``handles``, in order. A value NVML
        refuses is ``None``, never 0, and the others are still read; a GPU that is lost (no handle,
        or GpuIsLost on any call) has every measured value ``None``.
    :raises: nothing for NVML errors; other exceptions propagate.

    Calls: nvmlDeviceGetPerformanceState, nvmlDeviceGetClockInfo(NVML_CLOCK_SM / NVML_CLOCK_MEM),
    nvmlDeviceGetPowerUsage (mW), nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU),
    nvmlDeviceGetUtilizationRates (``.gpu``), nvmlDeviceGetCurrentClocksEventReasons, else
    nvmlDeviceGetCurrentClocksThrottleReasons (drivers and pynvml before R535).
    """
    rows = []
    for position, entry in enumerate(handles):
        if isinstance(entry, Mapping):
            index, handle = entry.get("index", position), entry.get("handle")
            identity = {"pci_bus_id": entry.get("pci_bus_id"), "uuid": entry.get("uuid")}
        else:
            index, handle = position, entry
            identity = _identity(nvml, handle) if handle is not None else {"pci_bus_id": None, "uuid": None}
        row = new_row(time_s, index, identity["pci_bus_id"], identity["uuid"])
        rows.append(row)
        if handle is None:
            if notes is not None:
                error = entry.get("error") if isinstance(entry, Mapping) else None
                notes.append({"gpu": index, "column": "*", "call": "nvmlDeviceGetHandleByIndex", "error": error or "GpuIsLost"})
            continue
        try:
            _measure(nvml, handle, index, row, notes)
        except _GpuLost:
            for column in VALUE_COLUMNS:
                row[column] = None
            if notes is not None:
                notes.append({"gpu": index, "column": "*", "call": None, "error": "GpuIsLost"})
    return rows


# --------------------------------------------------------------------------------------------
# nvidia-smi
# --------------------------------------------------------------------------------------------

def smi_query_argv(reasons_field: str = SMI_FIELDS[-1], nvidia_smi: str = "nvidia-smi") -> List[str]:
    """The argv of one ``nvidia-smi --query-gpu`` sample of every GPU.

    :param reasons_field: ``clocks_event_reasons.active`` (R535 on) or ``clocks_throttle_reasons.active``
        (the name drivers before R535 know; :data:`SMI_REASONS_FIELD_OLD`).
    :param nvidia_smi: the program (a path, or the name to look up in ``PATH``).
    :returns: ``[nvidia_smi, "--query-gpu=index,pci.bus_id,uuid,pstate,clocks.sm,clocks.mem,power.draw,
        temperature.gpu,utilization.gpu,clocks_event_reasons.active", "--format=csv,noheader,nounits"]``.
    :raises ValueError: for another ``reasons_field``.
    """
    if reasons_field not in (SMI_FIELDS[-1], SMI_REASONS_FIELD_OLD):
        raise ValueError("the clocks event reasons field is %s or %s, not %r"
                         % (SMI_FIELDS[-1], SMI_REASONS_FIELD_OLD, reasons_field))
    fields = SMI_FIELDS[:-1] + (reasons_field,)
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def smi_rejected_field(output: Any) -> Optional[str]:
    """The field nvidia-smi refused, from its ``Field "x" is not a valid field to query.``; else ``None``."""
    match = _SMI_BAD_FIELD.search(output if isinstance(output, str) else "")
    return match.group(1) if match else None


def smi_lost_gpu(line: Any) -> Optional[str]:
    """The PCI bus id of nvidia-smi's ``Unable to determine the device handle for GPU0000:3B:00.0: ...`` line.

    :returns: the normalised bus id (``"0000:3b:00.0"``), or ``None`` for any other line.
    """
    match = _SMI_LOST.match(line.strip() if isinstance(line, str) else "")
    return normalize_pci_bus_id(match.group(1)) if match else None


def parse_smi_query(text: Any, time_s: float = 0.0) -> List[Dict[str, Any]]:
    """Parse one sample of :func:`smi_query_argv` (``--format=csv,noheader,nounits``) into rows.

    :param text: nvidia-smi's output (``str``; ``bytes`` are decoded as UTF-8): one line per GPU,
        ``0, 00000000:18:00.0, GPU-..., P0, 1980, 2619, 310.25, 45, 100, 0x0000000000000004``, and for a
        GPU that fell off the bus the line ``Unable to determine the device handle for GPU...: ...``.
    :param time_s: seconds since the trace started, for every row.
    :returns: one row dict per GPU line, in order. "[N/A]", "N/A", "[Not Supported]", "[GPU is
        lost]", "[Unknown Error]" and a value that is not a number where one belongs are ``None``;
        the hex mask of clocks event reasons is decoded with facts_model.CLOCKS_EVENT_REASON_BITS.
        A lost GPU's row holds its bus id only (``gpu`` ``None``: nvidia-smi does not print the index).
    :raises ValueError: for input that is not text, or a line that is neither a GPU line of
        len(SMI_FIELDS) comma-separated values nor a lost GPU's line (the message gives its number).
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise ValueError("nvidia-smi --query-gpu output is text, got %s" % _shape(text))
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        lost = smi_lost_gpu(line)
        if lost is not None:
            rows.append(new_row(time_s, None, lost, None))
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            raise ValueError("nvidia-smi --query-gpu output line %d has %d comma-separated values, expected %d (%s)"
                             % (number, len(cells), len(SMI_FIELDS), ", ".join(SMI_FIELDS)))
        gpu, bus_id, uuid, pstate, sm, mem, power, temperature, utilization, reasons = cells
        row = new_row(time_s, _int(gpu), _text(bus_id), _text(uuid))
        row["pstate"] = _pstate(pstate)
        row["sm_clock_mhz"], row["mem_clock_mhz"] = _int(sm), _int(mem)
        watts = _number(power)
        row["power_w"] = None if watts is None else round(watts, 1)
        row["temperature_c"], row["utilization_gpu_pct"] = _int(temperature), _int(utilization)
        row["clocks_event_reasons"] = _reasons(reasons) if reasons.lower().startswith("0x") else None
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Summary and comparison
# --------------------------------------------------------------------------------------------

_SUMMARIZED = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "utilization_gpu_pct")
_CAPPING = ("sw_power_cap", "hw_slowdown")


def _key(row: Mapping[str, Any]) -> str:
    if row.get("pci_bus_id"):
        return row["pci_bus_id"]
    return "unknown" if row.get("gpu") is None else str(row["gpu"])


def _stat(values: List[float], column: str) -> Optional[float]:
    if not values:
        return None
    value = round(float(statistics.median(values)), 1)
    return int(value) if column != "power_w" and value.is_integer() else value


def summarize(rows: Any) -> Dict[str, Dict[str, Any]]:
    """Reduce a trace to one summary per GPU.

    :param rows: the trace, as :func:`check_rows` takes it (untrusted rows are typed first).
    :returns: ``{key: summary}``, keyed by PCI bus id (``"0000:18:00.0"``), else by the index as
        text (``"3"``), else ``"unknown"``, in the order the GPUs first appear. A summary is::

            {"gpu": 0, "pci_bus_id": "0000:18:00.0", "uuid": "GPU-...",
             "samples": 11,                       # rows of this GPU
             "sm_clock_mhz": {"median": 1980, "max": 1980},
             "mem_clock_mhz": {...}, "power_w": {"median": 310.2, "max": 355.0},
             "temperature_c": {...}, "utilization_gpu_pct": {...},
             "sm_clock_at_power_cap_mhz": 1410,   # median SM clock of the samples with sw_power_cap
                                                  # or hw_slowdown active; None when there are none
             "clocks_event_reasons": {"sw_power_cap": 0.545},  # share of the samples whose
                                                  # reasons were read, reasons seen only, 3 decimals
             "pstates": ["P0", "P2"]}             # P-states seen, in number order

        Medians and maxima are over the samples that have the value (``None`` when none has); a
        median is rounded to 1 decimal (clocks, temperature and utilization are ``int`` when whole).
    :raises ValueError: as :func:`check_rows`.
    """
    summaries = {}  # type: Dict[str, Dict[str, Any]]
    groups = {}  # type: Dict[str, List[Dict[str, Any]]]
    for row in check_rows(rows):
        groups.setdefault(_key(row), []).append(row)
    for key, group in groups.items():
        summary = {
            "gpu": next((row["gpu"] for row in group if row["gpu"] is not None), None),
            "pci_bus_id": next((row["pci_bus_id"] for row in group if row["pci_bus_id"]), None),
            "uuid": next((row["uuid"] for row in group if row["uuid"]), None),
            "samples": len(group),
        }  # type: Dict[str, Any]
        for column in _SUMMARIZED:
            values = [row[column] for row in group if row[column] is not None]
            summary[column] = {"median": _stat(values, column), "max": max(values) if values else None}
        capped = [row["sm_clock_mhz"] for row in group if row["sm_clock_mhz"] is not None
                  and any(reason in (row["clocks_event_reasons"] or []) for reason in _CAPPING)]
        summary["sm_clock_at_power_cap_mhz"] = _stat(capped, "sm_clock_mhz")
        read = [row["clocks_event_reasons"] for row in group if row["clocks_event_reasons"] is not None]
        counts = {}  # type: Dict[str, int]
        for reasons in read:
            for reason in reasons:
                counts[reason] = counts.get(reason, 0) + 1
        summary["clocks_event_reasons"] = {reason: round(count / float(len(read)), 3) for reason, count in counts.items()}
        pstates = {row["pstate"] for row in group if row["pstate"]}
        summary["pstates"] = sorted(pstates, key=lambda p: int(p[1:]))
        summaries[key] = summary
    return summaries


# (label, column, statistic or None, unit): what compare() looks at, in sentence order.
_COMPARED = (
    ("median SM clock", "sm_clock_mhz", "median", "MHz"),
    ("max SM clock", "sm_clock_mhz", "max", "MHz"),
    ("SM clock at power cap", "sm_clock_at_power_cap_mhz", None, "MHz"),
    ("median memory clock", "mem_clock_mhz", "median", "MHz"),
    ("median power draw", "power_w", "median", "W"),
    ("max power draw", "power_w", "max", "W"),
    ("median temperature", "temperature_c", "median", "°C"),
    ("max temperature", "temperature_c", "max", "°C"),
    ("median GPU utilization", "utilization_gpu_pct", "median", "%"),
)


def _check_summary(summary: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(summary, Mapping):
        raise ValueError("%s is not a trace summary (gpu_trace.summarize): expected a mapping of GPUs, got %s"
                         % (what, _shape(summary)))
    for key, value in summary.items():
        if not isinstance(value, Mapping):
            raise ValueError("%s: GPU %s is not a GPU summary (a mapping), got %s" % (what, key, _shape(value)))
        samples = value.get("samples")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ValueError("%s: GPU %s is not a GPU summary of summarize(): no sample count" % (what, key))
    return summary


def _metric(summary: Mapping[str, Any], column: str, statistic: Optional[str]) -> Optional[float]:
    value = summary.get(column)
    if statistic is not None:
        value = value.get(statistic) if isinstance(value, Mapping) else None
    return _number(value)


def _moved(before: Optional[float], after: Optional[float]) -> bool:
    if before is None or after is None:
        return (before is None) != (after is None)
    return abs(after - before) > max(MOVE_RELATIVE * abs(before), MOVE_ABSOLUTE)


def _show(value: Optional[float], unit: str, with_unit: bool, none: str = "unknown") -> str:
    if value is None:
        return none
    text = "%.1f" % value if unit == "W" or not float(value).is_integer() else "%d" % value
    return "%s %s" % (text, unit) if with_unit else text


def _change(label: str, before: Optional[float], after: Optional[float], unit: str) -> str:
    none = "not capped" if label == "SM clock at power cap" else "unknown"
    if before is not None and after is not None:
        return "%s: %s → %s" % (label, _show(before, unit, False), _show(after, unit, True))
    return "%s: %s → %s" % (label, _show(before, unit, True, none), _show(after, unit, True, none))


def _shares(summary: Mapping[str, Any]) -> Optional[Dict[str, float]]:
    shares = summary.get("clocks_event_reasons")
    if not isinstance(shares, Mapping):
        return None
    return {name: _number(share) or 0.0 for name, share in shares.items() if isinstance(name, str) and _REASON_NAME.match(name)}


def _pstates(summary: Mapping[str, Any]) -> Optional[List[str]]:
    value = summary.get("pstates")
    if not isinstance(value, (list, tuple)):
        return None
    return [p for p in (_pstate(item) for item in value) if p]


def _where(keys: List[str], paired: int) -> str:
    if len(keys) == 1:
        return "on GPU %s" % keys[0]
    if len(keys) == paired:
        return "on %d GPUs" % len(keys)
    return "on %d GPUs (%s)" % (len(keys), ", ".join(keys))


def compare(before: Any, after: Any) -> List[str]:
    """What moved between the trace before and the trace after an update of one node, as sentences.

    :param before: :func:`summarize` of the trace before. :param after: of the trace after.
    :returns: sentences such as ``"SM clock at power cap: 1410 → 1140 MHz on 8 GPUs"``,
        ``"median power draw: 310.2 → 355.0 W on GPU 0000:4e:00.0"``,
        ``"share of samples with sw_power_cap: 0 % → 60 % on 8 GPUs"``, ``"P-states seen: P0 → P0, P2
        on GPU 0000:18:00.0"``, ``"GPU 0000:4e:00.0 only in the trace before"``; ``[]`` when nothing
        moved. GPUs are paired by key (PCI bus id); GPUs with the same change share one sentence
        ("on 8 GPUs" when it is every paired GPU, else the GPUs are named). A value moved when it
        changed by more than the greater of :data:`MOVE_RELATIVE` (2 %) of the value before and
        :data:`MOVE_ABSOLUTE` (1 MHz, W, °C or percentage point); a reason's share of samples when
        it changed by more than :data:`MOVE_REASON_SHARE` (10 points); a known value against an
        unknown one always moved (``unknown``; ``not capped`` for the clock at power cap).
        Sentences come in the order of the metrics (clocks, power, temperature, utilization,
        reasons, P-states), then the GPUs present on one side only.
    :raises ValueError: when either side is not a mapping of GPU summaries (each with its
        ``samples`` count), naming the side and the GPU.
    """
    _check_summary(before, "before")
    _check_summary(after, "after")
    keys = [key for key in after if key in before]
    groups = {}  # type: Dict[tuple, List[str]]
    for order, (label, column, statistic, unit) in enumerate(_COMPARED):
        for key in keys:
            old, new = _metric(before[key], column, statistic), _metric(after[key], column, statistic)
            if _moved(old, new):
                groups.setdefault(((order,), _change(label, old, new, unit)), []).append(str(key))
    for key in keys:
        old_shares, new_shares = _shares(before[key]), _shares(after[key])
        if old_shares is None or new_shares is None:
            continue
        for name in set(old_shares) | set(new_shares):
            old, new = old_shares.get(name, 0.0), new_shares.get(name, 0.0)
            if abs(new - old) > MOVE_REASON_SHARE:
                text = "share of samples with %s: %d %% → %d %%" % (name, round(old * 100), round(new * 100))
                groups.setdefault(((len(_COMPARED),) + _reason_order(name), text), []).append(str(key))
    for key in keys:
        old_states, new_states = _pstates(before[key]), _pstates(after[key])
        if old_states is not None and new_states is not None and old_states != new_states:
            text = "P-states seen: %s → %s" % (", ".join(old_states) or "none", ", ".join(new_states) or "none")
            groups.setdefault(((len(_COMPARED) + 1,), text), []).append(str(key))
    # A stable sort: within one metric, the sentences keep the order of their first GPU.
    sentences = ["%s %s" % (text, _where(gpus, len(keys)))
                 for (_order, text), gpus in sorted(groups.items(), key=lambda item: item[0][0])]
    for side, only in (("before", [str(k) for k in before if k not in after]),
                       ("after", [str(k) for k in after if k not in before])):
        if only:
            sentences.append("GPU%s %s only in the trace %s" % ("s" if len(only) > 1 else "", ", ".join(only), side))
    return sentences
