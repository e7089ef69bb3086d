"""ctr_timeline_check.py FILE FIRST LAST NAMES: FILE (a trainer's --timeline)
is valid JSON holding, for each step FIRST..LAST, one span of each of NAMES
(comma-separated), in that order, with durations >= 0. Exits 1 saying why."""
import json
import sys


def main():
    path, first, last, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    spans = [e for e in json.load(open(path)) if e.get("ph") == "X"]
    for step in range(first, last + 1):
        got = sorted((e for e in spans if e["args"]["step"] == step and e["name"] in names),
                     key=lambda e: e["ts"])
        order = [e["name"] for e in got]
        if order != names:
            sys.exit(f"{path}: step {step}: spans {order}, expected {names}")
        if any(e["dur"] < 0 for e in got):
            sys.exit(f"{path}: step {step}: a negative duration")
    outside = sorted({e["args"]["step"] for e in spans} - set(range(first, last + 1)))
    if outside:
        sys.exit(f"{path}: spans of steps {outside} outside {first}:{last}")
    print(f"{path}: steps {first}..{last} each {', '.join(names)}")


main()
