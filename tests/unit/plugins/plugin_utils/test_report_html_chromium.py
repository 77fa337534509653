# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The HTML reports in a real browser: Debian's Chromium, headless, loading each page from file://.

No fleet is needed: the drift report (10,001 nodes, judged by the real engine) and the rollout
report directory (written by the real rollout report functions) are built here. Chromium renders
each page (its DOM holds the key numbers), logs no console error, and leaves a screenshot under
tests/output/reports/ as a test artifact. ``make host-packages`` installs ``chromium``; CI (``CI``
set) fails when it is missing, elsewhere the test is skipped.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_html
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift_output import write_atomic

import report_inputs as ri

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
ARTIFACTS = os.path.join(REPO, "tests", "output", "reports")
HOSTILE = "<script>document.title='owned'</script>"


def chromium():
    found = shutil.which("chromium")
    if found is None and os.environ.get("CI"):
        pytest.fail("chromium is missing: make host-packages installs Debian's chromium package")
    if found is None:
        pytest.skip("chromium is not installed here (apt-get install chromium); CI runs this test")
    return found


def browse(tool, profile, page, *mode):
    """Run headless Chromium on ``page`` with console logging; ``(stdout, stderr)``."""
    argv = [tool, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir=%s" % profile,
            "--enable-logging=stderr", "--v=0", "--window-size=1400,1000"] + list(mode) + ["file://" + page]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def console_errors(log):
    """Lines of Chromium's log that report a page error or a console message."""
    return [line for line in log.splitlines() if "Uncaught" in line or ":CONSOLE" in line]


def screenshot(tool, profile, page, name):
    """Screenshot ``page`` to tests/output/reports/<name>.png; returns the log and the PNG's size."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.join(ARTIFACTS, name + ".png")
    if os.path.exists(path):
        os.unlink(path)
    _out, log = browse(tool, profile, page, "--screenshot=%s" % path)
    with open(path, "rb") as handle:
        head = handle.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return log, struct.unpack(">II", head[16:24]), os.path.getsize(path)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    base = tmp_path_factory.mktemp("reports")
    report, expected = ri.drift_fleet(10000, hostile=HOSTILE)
    drift_page = str(base / "drift-report.html")
    write_atomic(drift_page, drift_html.render_html(report))
    done = ri.rollout_dir(str(base / "rollout"))
    return {"drift": drift_page, "rollout": done["paths"]["html"], "expected": expected, "profile": str(base / "profile")}


def test_drift_report_renders_in_chromium(pages):
    tool = chromium()
    dom, log = browse(tool, pages["profile"], pages["drift"], "--dump-dom")
    assert console_errors(log) == []
    assert '<div class="n">10001</div>' in dom
    assert "<b id=\"verdict\">%d of 10001 nodes drifted</b>" % pages["expected"]["drifted"] in dom
    assert "8 GPUs: 0000:18:00.0, 0000:2a:00.0, 0000:3a:00.0, 0000:4e:00.0" in dom
    # The hostile node name is text in the DOM, not an element that ran.
    assert "&lt;script&gt;document.title='owned'&lt;/script&gt;" in dom
    assert "<title>GPU fleet drift report</title>" in dom
    log, size, length = screenshot(tool, pages["profile"], pages["drift"], "drift-report")
    assert console_errors(log) == []
    assert size == (1400, 1000) and length > 30000


def test_rollout_report_renders_in_chromium(pages):
    tool = chromium()
    dom, log = browse(tool, pages["profile"], pages["rollout"], "--dump-dom")
    assert console_errors(log) == []
    assert ("<b>Completed</b>: 8 nodes: 7 upgraded, 0 already on target, 1 rolled back, 0 rolled back and still "
            "flagged, 0 flagged, 0 refused, 0 not started; 1 quarantined.") in dom
    assert "<li>reserved memory 545 → 612 MiB on 8 GPUs</li>" in dom
    assert dom.count('<path d="M') == 4 and 'id="timeline"' in dom
    log, size, length = screenshot(tool, pages["profile"], pages["rollout"], "rollout-report")
    assert console_errors(log) == []
    assert size == (1400, 1000) and length > 30000


def test_console_errors_are_seen(pages, tmp_path):
    """The console check itself: a page whose script throws is caught."""
    tool = chromium()
    broken = str(tmp_path / "broken.html")
    write_atomic(broken, "<!DOCTYPE html><html><body><script>undefinedFunction()</script></body></html>")
    _dom, log = browse(tool, pages["profile"], broken, "--dump-dom")
    assert console_errors(log), log[-2000:]
