"""Benchmark of the rollout report's cost per node record, at 100 and at 10,000 records.

Usage (from the repository root, with the project's virtualenv Python)::

    python benchmarks/rollout/records.py [--sizes 100,10000] [--appends 200] [--json]

For each size, a report directory is filled with that many node records (as the
``rollout_report`` action writes them, through ``plugin_utils.rollout_report.store_record`` with
the journal line appended under the same lock), then ``--appends`` more records are timed one by
one: the median per record is the cost a node pays when its transaction ends. The report itself
is rendered once per step (``render``); its time at each size is measured too. The previous
design rendered the whole report after every record: that cost is ``render`` per record.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_journal, rollout_report  # noqa: E402


def _record(index):
    node = "node%05d" % index
    return {"node": node, "stage": "waves", "class": "gpu_h100", "rollout_id": "bench", "run_id": "r1",
            "result": "upgraded", "reason": "verified on 620.82.01", "flags": [],
            "target": {"version": "620.82.01", "branch": "620", "requested": "ltsb", "note": None},
            "before": {"loaded": "580.126.20"}, "after": {"loaded": "620.82.01"},
            "durations": {"total_s": 1200.0}, "started_epoch": 1.0, "finished_epoch": 2.0}


def _store(directory, record):
    event = {"event": "finished", "node": record["node"], "status": "done", "result": "upgraded", "time": 2.0}
    rollout_report.store_record(directory, record, lambda merged: rollout_journal.append_in_lock(directory, event))


def measure(size, appends):
    """``{"records", "append_median_ms", "render_s"}`` for a report of ``size`` records."""
    directory = tempfile.mkdtemp(prefix="gpufleet-records-")
    try:
        nodes = [{"name": "node%05d" % i, "stage": "waves", "class": "gpu_h100", "domain": None}
                 for i in range(size + appends)]
        rollout_report.write_plan(directory, {"rollout_id": "bench", "nodes": nodes, "options": {},
                                              "stages": [{"name": "waves", "hosts": [n["name"] for n in nodes]}]})
        for index in range(size):
            _store(directory, _record(index))
        times = []
        for index in range(size, size + appends):
            start = time.perf_counter()
            _store(directory, _record(index))
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        rollout_report.render(directory)
        render_s = time.perf_counter() - start
        return {"records": size, "append_median_ms": round(statistics.median(times) * 1000.0, 3),
                "render_s": round(render_s, 3)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [measure(int(size), args.appends) for size in args.sizes.split(",")]
    result = {"rows": rows, "append_ratio_largest_to_smallest": round(
        rows[-1]["append_median_ms"] / max(rows[0]["append_median_ms"], 1e-9), 2)}
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        for row in rows:
            print("%6d records: %.3f ms per appended record, report rendered in %.3f s"
                  % (row["records"], row["append_median_ms"], row["render_s"]))
        print("append cost at %d / at %d records: %.2fx"
              % (rows[-1]["records"], rows[0]["records"], result["append_ratio_largest_to_smallest"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
