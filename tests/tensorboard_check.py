"""Checks --tensorboard's event files with the tensorboard package's own code
(run it with the venv's python, scripts/tensorboard-venv).

  tensorboard_check.py files LOGDIR METRICS STEPS_PER_EPOCH EPOCHS LOG_EVERY PSERVER_LOG...
      Every record of every file passes TensorBoard's record reader (lengths
      and both masked CRC-32Cs), the first is file_version "brain.Event:2";
      TensorBoard's EventAccumulator finds runs trainer-0, trainer-1,
      pserver-0, pserver-1; trainer 0's scalars are the metrics file's rows,
      value for value (float32 and the file's printed digits apart), one per
      row at the end of each epoch; trainer 1 has its own training curves at
      the same steps; each pserver's are its statistics lines.
  tensorboard_check.py http URL METRICS
      A running TensorBoard at URL lists the runs, and its scalars plugin's
      HTTP API gives trainer 0's eval/accuracy and train/loss series equal to
      the metrics file's.
"""
import glob
import json
import math
import os
import re
import sys
import urllib.parse
import urllib.request

# A metrics row's key for each of trainer 0's tags, and the decimals printed.
TRAINER_TAGS = {
    "train/loss": ("train_loss", 6),
    "eval/accuracy": ("test_accuracy", 6),
    "perf/samples_per_s": ("samples_per_s", 1),
    "perf/bytes_per_step": ("bytes_per_step", 0),
    "perf/comm_share": ("comm_share", 4),
}
STATS_LINE = re.compile(r"step (\d+): ([0-9.]+) pushes/s, in ([0-9.]+) MB/s, out ([0-9.]+) MB/s")
WAIT_LINE = re.compile(r"step (\d+): straggler trainer \d+, .* mean wait for the last push ([0-9.]+) ms")


def close(stored, printed, decimals):
    """stored is float32(x); printed is x with `decimals` digits."""
    tol = 0.5 * 10.0 ** -decimals + abs(printed) * 2.0 ** -23 + 1e-12
    return math.isfinite(stored) and abs(stored - printed) <= tol


def read_records(path):
    """Every record of path through TensorBoard's reader, which checks the
    CRCs (its loader would stop quietly at a bad one)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    reader = pywrap_tensorflow.PyRecordReader_New(path)
    events = []
    while True:
        try:
            reader.GetNext()  # DataLossError on a bad CRC or a torn record
        except errors.OutOfRangeError:
            return events
        events.append(event_pb2.Event.FromString(reader.record()))


def scalars(logdir, run):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.path.join(logdir, run), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check_files(logdir, metrics, steps_per_epoch, epochs, log_every, pserver_logs):
    runs = sorted(os.listdir(logdir))
    assert runs == ["pserver-0", "pserver-1", "trainer-0", "trainer-1"], f"runs {runs}"
    for run in runs:
        files = glob.glob(os.path.join(logdir, run, "events.out.tfevents.*"))
        assert len(files) == 1, f"{run}: event files {files}"
        events = read_records(files[0])
        assert events[0].file_version == "brain.Event:2", f"{run}: first event {events[0]}"
        assert all(e.HasField("summary") for e in events[1:]), f"{run}: events beyond scalars"
        print(f"{run}: {os.path.basename(files[0])}: {len(events)} records, CRCs good")

    rows = [json.loads(line) for line in open(metrics)]
    assert len(rows) == epochs, f"{len(rows)} metrics rows, expected {epochs}"
    want_steps = [steps_per_epoch * r["epoch"] for r in rows]
    t0 = scalars(logdir, "trainer-0")
    assert sorted(t0) == sorted(TRAINER_TAGS), f"trainer-0 tags {sorted(t0)}"
    for tag, (key, decimals) in TRAINER_TAGS.items():
        series = t0[tag]
        assert [s for s, _ in series] == want_steps, f"trainer-0 {tag}: steps {series}"
        for (step, value), row in zip(series, rows):
            assert close(value, row[key], decimals), \
                f"trainer-0 {tag} at step {step}: {value!r} in TensorBoard, {row[key]} in the metrics"
    print(f"trainer-0: {len(TRAINER_TAGS)} tags x {len(rows)} rows equal to the metrics file, "
          f"steps {want_steps}")

    t1 = scalars(logdir, "trainer-1")
    want = sorted(set(TRAINER_TAGS) - {"eval/accuracy"})  # trainer 0 evaluates
    assert sorted(t1) == want, f"trainer-1 tags {sorted(t1)}, expected {want}"
    for tag, series in t1.items():
        assert [s for s, _ in series] == want_steps, f"trainer-1 {tag}: steps {series}"
        assert all(math.isfinite(v) and v >= 0 for _, v in series), f"trainer-1 {tag}: {series}"
    assert t1["train/loss"] != t0["train/loss"], "trainer-1's loss is trainer 0's: not its own run"
    print(f"trainer-1: {len(t1)} tags at steps {want_steps}")

    for k, log in enumerate(pserver_logs):
        lines = {}
        for line in open(log):
            m = STATS_LINE.search(line)
            if m:
                lines.setdefault(int(m.group(1)), {}).update(
                    {"pserver/pushes_per_s": float(m.group(2)),
                     "pserver/in_MB_per_s": float(m.group(3)),
                     "pserver/out_MB_per_s": float(m.group(4))})
            m = WAIT_LINE.search(line)
            if m:
                lines.setdefault(int(m.group(1)), {})["pserver/last_push_wait_ms"] = float(m.group(2))
        steps = sorted(lines)
        assert steps and all(s % log_every == 0 for s in steps), f"pserver {k}: log steps {steps}"
        ps = scalars(logdir, f"pserver-{k}")
        assert sorted(ps) == sorted(lines[steps[0]]), f"pserver-{k} tags {sorted(ps)}"
        for tag, series in ps.items():
            assert [s for s, _ in series] == steps, f"pserver-{k} {tag}: steps {series}"
            for step, value in series:
                assert close(value, lines[step][tag], 1), \
                    f"pserver-{k} {tag} at step {step}: {value!r}, the log says {lines[step][tag]}"
        print(f"pserver-{k}: {len(ps)} tags x {len(steps)} statistics lines equal to its log")


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def check_http(url, metrics):
    rows = [json.loads(line) for line in open(metrics)]
    runs = get_json(url + "/data/runs")
    assert sorted(runs) == ["pserver-0", "pserver-1", "trainer-0", "trainer-1"], f"/data/runs {runs}"
    tags = get_json(url + "/data/plugin/scalars/tags")
    assert "eval/accuracy" in tags["trainer-0"], f"scalars tags {tags}"
    for tag in ("eval/accuracy", "train/loss"):
        key, decimals = TRAINER_TAGS[tag]
        q = urllib.parse.urlencode({"run": "trainer-0", "tag": tag})
        series = get_json(f"{url}/data/plugin/scalars/scalars?{q}")  # [[wall_time, step, value]]
        assert len(series) == len(rows), f"{tag}: {len(series)} points over HTTP, {len(rows)} rows"
        for (wall, step, value), row in zip(series, rows):
            assert wall > 1.6e9, f"{tag}: wall time {wall}"
            assert close(value, row[key], decimals), f"{tag} at step {step}: {value} over HTTP, {row[key]}"
        print(f"HTTP {tag}: {[(s, round(v, 4)) for _, s, v in series]} equal to the metrics file")


def main():
    if sys.argv[1] == "files":
        check_files(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
                    sys.argv[7:])
    else:
        check_http(sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
