"""Runs in the judge process (as `python -I -B -c <this source>`): the asserts, on plain data.

Never imported by the host, and never run where a solution ran. Standard input is one JSON object:
`judge` (the judging statements of `slime.sandbox.split_tests`, `[line, source]` each), `steps`
(the sandbox's steps, `[line, source, kind]` by index) and `output` (what the sandbox printed: one record
per line, see `probe_runner`). Records are read as JSON and rebuilt as plain Python values only
(no object of any other type can come out of them); the statements run in order with
`_slime_value(i)` giving probe i's value. The verdict is one line on the original standard output:
`@@slime-judge {"passed": bool, "reason": str}`; the tests' own prints go to /dev/null.
"""

import json
import os
import sys

MARK = "@@slime-judge "
_SCALARS = (type(None), bool, int, float, str)
_SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


class ProbeFailed(Exception):
    pass


def decode(x, depth=0):
    if depth > 100:
        raise ValueError("nested deeper than 100")
    if type(x) in _SCALARS:
        return x
    if type(x) is dict and len(x) == 1:
        ((tag, v),) = x.items()
        if tag == "bytes" and type(v) is str:
            return bytes.fromhex(v)
        if tag == "complex" and type(v) is list and len(v) == 2 and all(type(p) in (int, float) for p in v):
            return complex(v[0], v[1])
        if tag in _SEQUENCES and type(v) is list:
            return _SEQUENCES[tag](decode(item, depth + 1) for item in v)
        if tag == "dict" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            return {decode(k, depth + 1): decode(val, depth + 1) for k, val in v}
    raise ValueError("not a plain value")


def records_of(output):
    """{index: record} from the sandbox's lines; the first record of an index counts."""
    records = {}
    for line in output.splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(rec) is list and len(rec) == 3 and type(rec[0]) is int and type(rec[1]) is str:
            records.setdefault(rec[0], rec)
    return records


def main():
    request = json.loads(sys.stdin.read())
    out = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    steps = {i: (line, source, kind) for i, (line, source, kind) in enumerate(request["steps"])}
    records = records_of(request["output"])

    def value(i):
        _, source, _ = steps[i]
        rec = records.get(i)
        if rec is None:
            raise ProbeFailed(f"{source} gave no value (the program stopped before it)")
        status, payload = rec[1], rec[2]
        if status == "ok":
            try:
                return decode(payload)
            except (ValueError, TypeError, RecursionError):
                raise ProbeFailed(f"{source} came back malformed") from None
        if status == "not-plain":
            raise ProbeFailed(f"{source} returned a {str(payload)[:60]}, not plain data")
        raise ProbeFailed(f"{source} raised {str(payload)[:200]}")

    verdict = {"passed": True, "reason": "passed"}
    # a statement the sandbox ran for its effect (`s = Stack()`) that raised ended its run there
    failed = [i for i, rec in sorted(records.items()) if i in steps and steps[i][2] == "exec" and rec[1] == "raised"]
    if -1 in records:  # the program itself failed before any test ran
        verdict = {"passed": False, "reason": f"the program failed: {str(records[-1][2])[:300]}"}
    elif failed:
        line, source, _ = steps[failed[0]]
        verdict = {"passed": False, "reason": f"tests line {line}: {source} raised {str(records[failed[0]][2])[:200]}"}
    else:
        names = {"__name__": "__judge__", "_slime_value": value}
        for line, source in request["judge"]:
            try:
                exec(compile(source, "tests.py", "exec"), names)
            except AssertionError:
                verdict = {"passed": False, "reason": f"tests line {line}: assertion failed"}
            except ProbeFailed as e:
                verdict = {"passed": False, "reason": f"tests line {line}: {e}"}
            except Exception as e:  # noqa: BLE001 - the tests' own error is a failed test
                verdict = {"passed": False, "reason": f"tests line {line}: {type(e).__name__}: {str(e)[:200]}"}
            if not verdict["passed"]:
                break
    os.write(out, (MARK + json.dumps(verdict) + "\n").encode())


if __name__ == "__main__":
    main()
