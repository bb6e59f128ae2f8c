"""Counts of `make mutants`' results per module, from mutmut's files under mutants/, for the mutants selected by
the given name patterns (mutmut's own `results` lists survivors only, with no counts). Survivors are listed
by name: `mutmut show NAME` prints the change; TESTING.md lists the ones that cannot be killed, and why."""

from __future__ import annotations

import fnmatch
import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code  # what each exit code of a mutant's test run means


def main(patterns: list[str]) -> None:
    counts: dict[str, Counter] = {}
    survivors: list[str] = []
    for meta in sorted(Path("mutants").rglob("*.py.meta")):
        results = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in results.items():
            if not any(fnmatch.fnmatch(name, p) for p in patterns):
                continue
            status = status_by_exit_code[code]
            if status == "check was interrupted by user":  # the mutant raised KeyboardInterrupt in the tests
                status = "killed"
            counts.setdefault(name.split(".")[1], Counter())[status] += 1
            if status in ("survived", "no tests"):
                survivors.append(f"{name} ({status})")
    columns = ["killed", "survived", "no tests", "timeout", "segfault", "suspicious", "not checked"]
    print(f"{'module':<12}" + "".join(f"{c:>12}" for c in columns) + f"{'score':>8}")
    total: Counter = Counter()
    for module, counter in sorted(counts.items()):
        total.update(counter)
        print(_row(module, counter, columns))
    print(_row("all", total, columns))
    print("\nSurvivors:" if survivors else "\nNo survivors.")
    for name in survivors:
        print(f"  {name}")


def _row(module: str, counter: Counter, columns: list[str]) -> str:
    caught = counter["killed"] + counter["timeout"] + counter["segfault"]
    tried = caught + counter["survived"] + counter["no tests"]
    score = f"{caught / tried:.1%}" if tried else "-"
    return f"{module:<12}" + "".join(f"{counter[c]:>12}" for c in columns) + f"{score:>8}"


if __name__ == "__main__":
    main(sys.argv[1:] or ["*"])
