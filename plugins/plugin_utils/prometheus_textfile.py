# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prepared Prometheus metric families written as one textfile, through ``prometheus_client``.

The one writer of the collection's ``*.prom`` files: the drift report's (``drift_prometheus``)
and the rollout report's (``rollout_prometheus``). The families are registered in a
``CollectorRegistry`` of their own and written by ``prometheus_client.write_to_textfile``, which
writes a temporary file in the same directory and renames it, so node_exporter's textfile
collector (``--collector.textfile.directory``) never reads half a file.

Source: prometheus_client's documentation, "Custom Collectors" (an object whose ``collect()``
yields metric families) and "Node exporter textfile collector" (``write_to_textfile``).
Controller side only.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable, List

#: The collection's controller Python requirements (prometheus-client, msgspec), at its root.
REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "requirements.txt")


class PrometheusUnavailable(Exception):
    """``prometheus_client`` is not installed on the controller."""


class _Families(object):
    """A ``prometheus_client`` collector that yields prepared metric families."""

    def __init__(self, families: List[Any]):
        self.families = families

    def collect(self) -> Iterable[Any]:
        """The families, as ``CollectorRegistry`` asks for them."""
        return iter(self.families)


def remedy() -> str:
    """What is missing and the command that gets it: the one text of every message about a missing
    ``prometheus_client`` (:func:`skipped_note`, :func:`unavailable_message`).

    :returns: one clause naming the controller's Python (``sys.executable``) and the command that
        installs the collection's controller requirements (:data:`REQUIREMENTS`), e.g.
        ``"the controller's Python (/venv/bin/python3) has no prometheus_client; to get it, install
        the collection's controller requirements (/venv/bin/python3 -m pip install -r
        .../gpufleet/nvidia/requirements.txt) and run the report again"``.
    :raises: nothing.
    """
    python = sys.executable
    return ("the controller's Python (%s) has no prometheus_client; to get it, install the collection's controller "
            "requirements (%s -m pip install -r %s) and run the report again" % (python, python, REQUIREMENTS))


def unavailable_message() -> str:
    """Why a Prometheus output that was asked for cannot be written (:class:`PrometheusUnavailable`).

    :returns: ``"the Prometheus output was asked for (formats names prometheus) but "`` + :func:`remedy`
        + ``", or leave prometheus out of the formats"``.
    :raises: nothing.
    """
    return "the Prometheus output was asked for (formats names prometheus) but %s, or leave prometheus out of the formats" % (
        remedy())


def require() -> None:
    """Check that ``prometheus_client`` can be imported.

    :raises PrometheusUnavailable: when it cannot, with :func:`unavailable_message` (what to do).
    """
    try:
        import prometheus_client  # noqa: F401 pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        raise PrometheusUnavailable(unavailable_message())


def skipped_note(path: str) -> str:
    """What a report says once when its default formats meant a Prometheus file it could not write.

    :param path: the textfile that was not written.
    :returns: one sentence naming the file and then :func:`remedy` (the controller's Python and the
        command that installs the collection's controller requirements), e.g.
        ``"the Prometheus textfile /r/gpufleet_drift.prom was not written: the controller's Python
        (/venv/bin/python3) has no prometheus_client; to get it, install the collection's controller
        requirements (/venv/bin/python3 -m pip install -r .../gpufleet/nvidia/requirements.txt) and run
        the report again; every other format was written"``.
    :raises: nothing.
    """
    return "the Prometheus textfile %s was not written: %s; every other format was written" % (path, remedy())


def available() -> bool:
    """Whether ``prometheus_client`` can be imported on this controller."""
    try:
        require()
    except PrometheusUnavailable:
        return False
    return True


def write_families(path: str, families: List[Any]) -> None:
    """Write metric families to ``path`` as a Prometheus textfile (a temporary file and a rename).

    :param families: ``prometheus_client`` metric families (``GaugeMetricFamily`` ...), written in
        this order.
    :raises PrometheusUnavailable: when ``prometheus_client`` is not installed on the controller.
    :raises OSError: when the directory cannot be written.
    """
    require()
    from prometheus_client import CollectorRegistry, write_to_textfile  # pylint: disable=import-outside-toplevel
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    write_to_textfile(path, registry)
