"""Where a test run's time goes, from pytest's JUnit XML (``pytest --junitxml=run.xml``).

    python scripts/test_times.py run.xml [more.xml ...] [--top 30] [--files 20]

Prints the slowest tests (set-up, call and tear-down together, as JUnit counts them) and the
total per test module. Several files (one per database, say) are read together, each test
named with the file it came from. tests/README.md keeps the figures this printed.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def _cases(path: Path) -> list[tuple[str, str, float]]:
    """(module, test id, seconds) of each test case in a JUnit XML file."""
    cases = []
    for case in ET.parse(path).iter("testcase"):  # noqa: S314 - our own run's report
        module = case.get("classname", "").split(".")
        # "tests.providers.test_x" or "tests.test_x.TestClass": the module is the test_ part.
        while module and not module[-1].startswith("test_"):
            module.pop()
        name = "/".join(module) + ".py" if module else case.get("classname", "")
        cases.append((name, f"{name}::{case.get('name')}", float(case.get("time") or 0)))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="JUnit XML files")
    parser.add_argument("--top", type=int, default=30, help="how many slowest tests")
    parser.add_argument("--files", type=int, default=20, help="how many slowest modules")
    args = parser.parse_args()

    tests: list[tuple[float, str]] = []
    modules: collections.Counter[str] = collections.Counter()
    for run in args.runs:
        label = f" [{run.stem}]" if len(args.runs) > 1 else ""
        for module, test, seconds in _cases(run):
            tests.append((seconds, test + label))
            modules[module + label] += seconds
    total = sum(seconds for seconds, _ in tests)
    print(f"{len(tests)} tests, {total:.0f} s in all (summed over processes)\n")
    print(f"| slowest {args.top} tests | s |\n|---|---|")
    for seconds, test in sorted(tests, reverse=True)[: args.top]:
        print(f"| `{test}` | {seconds:.1f} |")
    print(f"\n| slowest {args.files} modules | s |\n|---|---|")
    for module, seconds in modules.most_common(args.files):
        print(f"| `{module}` | {seconds:.0f} |")


if __name__ == "__main__":
    main()
