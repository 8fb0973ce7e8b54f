"""read_events.py DIR...: checks each run directory's TensorBoard events against its result.json.

Every DIR is read with tensorboard's EventAccumulator (as TensorBoard reads a run): each numeric
metric of every result.json row (nested keys joined with "/", bools as 0/1; not
training_iteration, the step, nor timestamp, the wall time) must be a scalar with the same value
(float32) at that row's training_iteration, and nothing else may be there. A row whose step is
not above the previous row's begins a resumed attempt, whose rows replace the earlier ones from
that step on (as the attempt's SessionLog START does in TensorBoard). A tuner's trial directory
(trial_NNNNN) must also hold an HParams session (TensorBoard's HParams tab), parsed by the hparams
plugin's own reader, whose hyperparameters are params.json's (nested keys joined with "/"); other
run directories must hold none. Prints one line per directory; exits 1 on the first difference.
"""
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata


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
    sessions = check_hparams(run_dir, acc)
    print(f"ok: {run_dir}: {len(files)} events file(s), {len(want)} scalars at {steps} steps, as in result.json"
          + (f"; an HParams session of {sessions} hyperparameters" if sessions is not None else ""))


def check_hparams(run_dir, acc):
    """The HParams session of a trial directory, read by the hparams plugin: params.json's values."""
    try:
        content = acc.PluginTagToContent(hparams_metadata.PLUGIN_NAME)
    except KeyError:  # no summary of the plugin in this run
        content = {}
    trial = os.path.basename(os.path.normpath(run_dir)).startswith("trial_")
    if not trial:
        if content:
            fail(f"{run_dir}: HParams data {sorted(content)} in a directory that is not a trial")
        return None
    if hparams_metadata.SESSION_START_INFO_TAG not in content:
        fail(f"{run_dir}: no HParams session start (tags: {sorted(content)})")
    info = hparams_metadata.parse_session_start_info_plugin_data(content[hparams_metadata.SESSION_START_INFO_TAG])
    got = {}
    for key, value in info.hparams.items():
        kind = value.WhichOneof("kind")
        got[key] = getattr(value, kind)
    with open(os.path.join(run_dir, "params.json")) as f:
        params = dict(flatten(json.load(f)))
    want = {}
    for key, value in params.items():
        want[key] = value if isinstance(value, (bool, str)) else float(value) if isinstance(value, (int, float)) else json.dumps(value, separators=(",", ":"))
    if got != want:
        fail(f"{run_dir}: HParams session {got}, params.json {want}")
    return len(got)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        fail("usage: read_events.py DIR...")
    for d in sys.argv[1:]:
        check(d)
