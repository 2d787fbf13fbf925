"""Counts a leg's tests from its log (scripts/test_legs.sh): prints "passed failed skipped".

CTest's lines ("12/110 Test #12: Name ....   Passed   1.20 sec") name what ran. A test that is
a GoogleTest suite (tests/suites.cmake) counts as the tests in its JSON report in RESULTS_DIR,
one passed, failed or skipped each; a suite with no report (it crashed) counts as one failed
test. Any other CTest test counts as itself. A log with no CTest line (a GoogleTest program
run directly, the bundle's check) is counted from GoogleTest's or the check's closing lines.

    python3 scripts/test_counts.py LOG [RESULTS_DIR]
"""
import json
import os
import re
import sys

CTEST = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+).*? \.+\s*\**(Passed|Failed|Skipped|Not Run|Timeout|Exception|\w+)",
                   re.M)


def suite_counts(path):
    with open(path) as f:
        report = json.load(f)
    passed = failed = skipped = 0
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            if test.get("failures"):
                failed += 1
            elif test.get("result") == "SKIPPED":
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def main():
    log = open(sys.argv[1], errors="replace").read()
    results = sys.argv[2] if len(sys.argv) > 2 else ""
    passed = failed = skipped = 0
    seen = False
    for m in CTEST.finditer(log):
        seen = True
        name, status = m.group(1), m.group(2)
        report = os.path.join(results, name.replace("/", "_") + ".json") if results else ""
        if report and os.path.exists(report) and status in ("Passed", "Failed"):
            p, f, s = suite_counts(report)
            if status == "Failed" and f == 0:
                f = 1  # the process failed after its tests (a leak report, a crash at exit)
            passed, failed, skipped = passed + p, failed + f, skipped + s
        elif status == "Passed":
            passed += 1
        elif status == "Skipped":
            skipped += 1
        else:
            failed += 1
    if not seen:
        total = re.findall(r"^\[==========\] (\d+) tests? from .* ran\.", log, re.M)
        fails = re.findall(r"^\[  FAILED  \] (\d+) tests?,", log, re.M)
        skips = re.findall(r"^\[  SKIPPED \] (\d+) tests?,", log, re.M)
        bundle = re.findall(r"^chroot_check: report: (\d+) gpu tests, all skipped", log, re.M)
        if bundle:
            skipped = int(bundle[-1])
        elif total:
            failed = int(fails[-1]) if fails else 0
            skipped = int(skips[-1]) if skips else 0
            passed = int(total[-1]) - failed - skipped
    print(passed, failed, skipped)


if __name__ == "__main__":
    main()
