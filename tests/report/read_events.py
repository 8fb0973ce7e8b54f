"""read_events.py DIR...: checks each run directory's TensorBoard events against its result.json.

Every DIR is read with tensorboard's EventAccumulator (as TensorBoard reads a run): each numeric
metric of every result.json row (nested keys joined with "/", bools as 0/1; not
training_iteration, the step, nor timestamp, the wall time) must be a scalar with the same value
(float32) at that row's training_iteration, and nothing else may be there. A row whose step is
not above the previous row's begins a resumed attempt, whose rows replace the earlier ones from
that step on (as the attempt's SessionLog START does in TensorBoard). Prints one line per
directory; exits 1 on the first difference.
"""
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator


def flatten(row, prefix=""):
    for key in sorted(row):
        value = row[key]
        name = f"{prefix}/{key}" if prefix else key
        if isinstance(value, dict) and value:
            yield from flatten(value, name)
        else:
            yield name, value


def as_shown(rows):
    """result.json's rows as TensorBoard shows them: a resumed attempt replaces the steps it repeats."""
    shown = []
    for row in rows:
        step = row["training_iteration"]
        if shown and step <= shown[-1]["training_iteration"]:
            shown = [r for r in shown if r["training_iteration"] < step]
        shown.append(row)
    return shown


def expected_scalars(rows):
    """{tag: [(step, value)]} from result.json's rows."""
    out = {}
    for row in as_shown(rows):
        step = row["training_iteration"]
        for key, value in flatten(row):
            if key in ("training_iteration", "timestamp"):
                continue
            if isinstance(value, bool):
                value = 1.0 if value else 0.0
            elif not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            out.setdefault(key, []).append((step, float(value)))
    return out


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def check(run_dir):
    with open(os.path.join(run_dir, "result.json")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        fail(f"{run_dir}: result.json has no rows")
    files = [n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents.")]
    if not files:
        fail(f"{run_dir}: no events file")
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = expected_scalars(rows)
    if tags != set(want):
        fail(f"{run_dir}: the events have tags {sorted(tags)}, result.json's numeric metrics are {sorted(want)}")
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if [s for s, _ in got] != [s for s, _ in points]:
            fail(f"{run_dir}: {tag} at steps {[s for s, _ in got]}, result.json has {[s for s, _ in points]}")
        for (step, value), (_, expected) in zip(got, points):
            if not math.isclose(value, expected, rel_tol=1e-6, abs_tol=1e-30):
                fail(f"{run_dir}: {tag} at step {step} is {value}, result.json has {expected}")
    steps = len(as_shown(rows))
    print(f"ok: {run_dir}: {len(files)} events file(s), {len(want)} scalars at {steps} steps, as in result.json")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        fail("usage: read_events.py DIR...")
    for d in sys.argv[1:]:
        check(d)
