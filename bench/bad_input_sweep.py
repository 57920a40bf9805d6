"""Classifies every case of tests/test_bad_inputs.py: clear error, traceback, silent success,
unclear message, leftovers (the sweep figures of issue 30; BUILD_NOTES.md section 8.6).

    PYTHONPATH=. python bench/bad_input_sweep.py [--json out.json]

Runs the cases in-process (tests/cli_harness.py). Old code (before the shared boundary)
prints `<tool>: error: ...` or absl's `FATAL Flags parsing error: ...`; both count as an
error line here, so the figures compare what a user sees, not the prefix.
"""

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


def main():
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    root = tempfile.mkdtemp(prefix="sweep-")
    fx = suite.build_fixtures(os.path.join(root, "fixtures") and os.makedirs(
        os.path.join(root, "fixtures")) or os.path.join(root, "fixtures"))
    counts, left, rows = collections.Counter(), 0, []
    for i, (case_id, tool, template, subject) in enumerate(suite.CASES):
        work = os.path.join(root, f"w{i}")
        os.makedirs(work)
        before_f, before_w = tree(fx), tree(work)
        result = run_tool(tool, suite._argv(template, fx, work))
        leftovers = tree(fx) != before_f or tree(work) != before_w
        kind = classify(result, subject.format(F=fx, W=work), leftovers)
        counts[kind] += 1
        left += leftovers
        last = (result.stderr.strip().splitlines() or [""])[-1][:160]
        rows.append({"case": case_id, "kind": kind, "leftovers": leftovers, "code": result.code,
                     "last_line": last})
        print(f"{kind:15s} {'LEFT' if leftovers else '    '} {case_id}: {last}", flush=True)
    summary = {"cases": len(suite.CASES), **counts, "leftovers": left}
    print(json.dumps(summary))
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        with open(sys.argv[2], "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
