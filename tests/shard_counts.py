"""Each epoch's examples counted once from the trainers' side: the
examples_applied of every trainer's epoch rows (metrics files) plus what
pserver 0's log says each gone trainer process had applied of the epoch
must equal the data set's size (docs/elastic.md, Counting).

  shard_counts.py PSERVER0_LOG EXAMPLES EPOCHS ROWS_FILE...
"""
import json
import re
import sys

log, examples, epochs, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
applied = {e: 0 for e in range(1, epochs + 1)}
for path in rows:
    for line in open(path):
        row = json.loads(line)
        applied[row["epoch"]] += row["examples_applied"]
for m in re.finditer(r"process applied (\d+) examples of epoch (\d+)", open(log).read()):
    applied[int(m.group(2))] += int(m.group(1))
if any(n != examples for n in applied.values()):
    sys.exit(f"rows + gone processes per epoch: {applied}, not {examples} each")
