"""Classifies every case of tests/test_bad_inputs.py: clear error, traceback, silent success,
unclear message, leftovers (the sweep figures of issue 30; BUILD_NOTES.md section 8.6).

    PYTHONPATH=. python bench/bad_input_sweep.py [--json out.json]

Runs the cases in-process (tests/cli_harness.py). Old code (before the shared boundary)
prints `<tool>: error: ...` or absl's `FATAL Flags parsing error: ...`; both count as an
error line here, so the figures compare what a user sees, not the prefix.
"""

import argparse
import collections
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from cli_harness import run_tool, tree  # noqa: E402
import test_bad_inputs as suite  # noqa: E402

ERROR_LINE = re.compile(r"^(\w+: )?error:|^FATAL Flags parsing error:")


def classify(result, subject, leftovers):
    if "Traceback" in result.stderr:
        return "traceback"
    if result.code == 0:
        return "silent success"
    lines = [l for l in result.stderr.splitlines() if ERROR_LINE.match(l)]
    if len(lines) == 1 and subject in lines[0]:
        return "clear"
    return "unclear"


def sweep(root):
    """Runs every case under `root` (fixtures and one work directory per case): its rows."""
    fixtures = os.path.join(root, "fixtures")
    os.makedirs(fixtures)
    fx = suite.build_fixtures(fixtures)
    rows = []
    for i, (case_id, tool, template, subject) in enumerate(suite.CASES):
        work = os.path.join(root, f"w{i}")
        os.makedirs(work)
        before_f, before_w = tree(fx), tree(work)
        result = run_tool(tool, suite._argv(template, fx, work))
        leftovers = tree(fx) != before_f or tree(work) != before_w
        kind = classify(result, subject.format(F=fx, W=work), leftovers)
        last = (result.stderr.strip().splitlines() or [""])[-1][:160]
        rows.append({"case": case_id, "kind": kind, "leftovers": leftovers, "code": result.code,
                     "last_line": last})
        print(f"{kind:15s} {'LEFT' if leftovers else '    '} {case_id}: {last}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="", help="also write the summary and every row here")
    args = parser.parse_args()
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="sweep-") as root:
        rows = sweep(root)
    counts = collections.Counter(row["kind"] for row in rows)
    left = sum(row["leftovers"] for row in rows)
    summary = {"cases": len(suite.CASES), **counts, "leftovers": left}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
