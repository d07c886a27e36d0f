"""Test runner executed *inside the sandbox* (stdlib only; uploaded as a file).

Usage: ``python3 runner.py bundle.json`` prints one JSON object ``{"results": [...],
"total_time": s}``. The bundle holds ``mode`` ("stdin" or "func"), ``code``, ``fn_name``,
``inputs``, ``outputs``, ``timeout`` and ``workers``. Each test runs as its own subprocess
with a timeout; outputs are compared leniently (see ``outputs_match``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, InvalidOperation

PREAMBLE = (
    "import sys, math, re, string, heapq, bisect, functools, itertools, collections\n"
    "from itertools import *\nfrom collections import *\nfrom functools import *\n"
    "from typing import *\nfrom math import *\nsys.setrecursionlimit(100000)\n"
)
FUNC_WRAPPER = r"""
import json, sys, ast
sys.path.insert(0, ".")
def _load(line):
    try:
        return json.loads(line)
    except ValueError:
        return ast.literal_eval(line)
args = [_load(l) for l in open(sys.argv[1]).read().split("\n") if l.strip()]
import solution as _m
fn_name = sys.argv[2]
target = getattr(_m.Solution(), fn_name) if hasattr(_m, "Solution") else getattr(_m, fn_name)
try:
    result = target(*args)
    if isinstance(result, tuple):
        result = list(result)
    print(json.dumps({"success": True, "result": result}, default=str))
except Exception as exc:
    print(json.dumps({"success": False, "error": repr(exc)}))
"""
LIMIT = 1000


def _numbers_match(a: str, b: str) -> bool:
    try:
        return abs(Decimal(a) - Decimal(b)) <= Decimal("0.001")
    except (InvalidOperation, ValueError):
        return False


def outputs_match(actual: str, expected: str) -> bool:
    """Trimmed, line-wise, token-wise, or numeric (|diff| <= 1e-3 per token) equality."""
    if actual.strip() == expected.strip():
        return True
    a_lines = [line.rstrip() for line in actual.strip().splitlines()]
    e_lines = [line.rstrip() for line in expected.strip().splitlines()]
    if a_lines == e_lines:
        return True
    a_tok, e_tok = actual.split(), expected.split()
    if a_tok == e_tok:
        return True
    return (
        len(a_tok) == len(e_tok)
        and bool(a_tok)
        and all(x == y or _numbers_match(x, y) for x, y in zip(a_tok, e_tok, strict=True))
    )


def results_match(result: object, expected: object) -> bool:
    """Function-call results: tuples compare as lists; ``expected`` may be wrapped in a list."""
    result = json.loads(json.dumps(result, default=str))
    if result == expected:
        return True
    return isinstance(expected, list) and len(expected) == 1 and result == expected[0]


def _as_text(value: object) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _run(cmd: list[str], stdin: str, timeout: float) -> tuple[int | None, str, str, bool]:
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, out, "timeout", True


def run_test(i: int, bundle: dict) -> dict:
    """Run test ``i`` and return its record."""
    start = time.time()
    expected = bundle["outputs"][i]
    record: dict = {"i": i, "input": _as_text(bundle["inputs"][i])[:LIMIT]}
    if bundle["mode"] == "stdin":
        code, out, err, timed_out = _run(
            [sys.executable, "solution.py"], _as_text(bundle["inputs"][i]), bundle["timeout"]
        )
        record["passed"] = not timed_out and code == 0 and outputs_match(out, _as_text(expected))
    else:
        path = f"input_{i}.txt"
        with open(path, "w") as fh:
            fh.write(_as_text(bundle["inputs"][i]))
        code, out, err, timed_out = _run(
            [sys.executable, "wrapper.py", path, bundle["fn_name"]], "", bundle["timeout"]
        )
        record["passed"] = False
        if not timed_out and code == 0:
            try:
                payload = json.loads(out.strip().splitlines()[-1])
                record["actual_result"] = str(payload.get("result"))[:LIMIT]
                record["passed"] = bool(payload.get("success")) and results_match(
                    payload.get("result"), expected
                )
            except (ValueError, IndexError):
                record["error"] = "wrapper printed no JSON"
    record.update(exit_code=code, stdout=out[:LIMIT], stderr=err[:LIMIT], expected=_as_text(expected)[:LIMIT])
    record.update(time=time.time() - start, timeout=timed_out)
    return record


def main(bundle_path: str) -> None:
    with open(bundle_path) as fh:
        bundle = json.load(fh)
    os.chdir(os.path.dirname(os.path.abspath(bundle_path)))
    with open("solution.py", "w") as fh:
        fh.write(PREAMBLE + bundle["code"])
    with open("wrapper.py", "w") as fh:
        fh.write(FUNC_WRAPPER)
    start = time.time()
    count = len(bundle["inputs"])
    with ThreadPoolExecutor(max(1, min(count, bundle.get("workers", 4)))) as pool:
        results = list(pool.map(lambda i: run_test(i, bundle), range(count)))
    print(json.dumps({"results": results, "total_time": time.time() - start}))


if __name__ == "__main__":
    main(sys.argv[1])
