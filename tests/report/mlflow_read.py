"""Reads back what cohort logged to an MLflow tracking server, through MLflow's own client.

mlflow_read.py URI quickstart: examples/quickstart's run (--mlflow URI, 2 ranks, 20 epochs);
mlflow_read.py URI run NAME STEPS: mlflow_program's trainer run NAME; mlflow_read.py URI sweep NAME
STEPS: its sweep NAME (a parent run and 4 nested trial runs). Checks params, every metric step, the
tags (host, world size, LibTorch's version, the best and the latest checkpoint) and the nesting;
exits 1 with the first difference.
"""
import sys

from mlflow.tracking import MlflowClient


def fail(why):
    print("FAIL:", why)
    sys.exit(1)


def check_run(client, run, params, steps, world_size, metrics=("loss", "val/acc", "epoch"), first_epoch=1,
              checkpoints=True):
    data = run.data
    for key, value in params.items():
        if data.params.get(key) != value:
            fail(f"run {run.info.run_name}: param {key} = {data.params.get(key)!r}, expected {value!r}")
    for metric in metrics:
        history = client.get_metric_history(run.info.run_id, metric)
        got = sorted(m.step for m in history)
        if got != list(range(1, steps + 1)):
            fail(f"run {run.info.run_name}: metric {metric} at steps {got}, expected 1..{steps}")
    epochs = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "epoch")}
    if any(epochs[s] != s - 1 + first_epoch for s in epochs):
        fail(f"run {run.info.run_name}: epoch values {epochs}, expected step - 1 + {first_epoch}")
    for tag in ("host", "world_size"):
        if tag not in data.tags:
            fail(f"run {run.info.run_name}: no tag {tag} (tags: {sorted(data.tags)})")
    if data.tags["world_size"] != str(world_size):
        fail(f"run {run.info.run_name}: world_size tag {data.tags['world_size']}, expected {world_size}")
    if checkpoints:
        # mlflow_program's loss falls until step steps // 2 and rises after: the best checkpoint
        # (every 5th step) is the last one at or before the middle, the latest the last one.
        last, best = (steps // 5) * 5, (steps // 2 // 5) * 5
        for tag, want in (("cohort.checkpoint", best), ("cohort.latest_checkpoint", last)):
            if not data.tags.get(tag, "").endswith(f"checkpoint_{want:06d}"):
                fail(f"run {run.info.run_name}: {tag} is {data.tags.get(tag)}, expected checkpoint {want}")
    elif "cohort.checkpoint" in data.tags or "cohort.latest_checkpoint" in data.tags:
        fail(f"run {run.info.run_name}: checkpoint tags without a checkpoint ({sorted(data.tags)})")
    if not data.tags.get("libtorch", "")[:1].isdigit():
        fail(f"run {run.info.run_name}: libtorch tag {data.tags.get('libtorch')!r}, expected LibTorch's version")
    if run.info.status != "FINISHED":
        fail(f"run {run.info.run_name}: status {run.info.status}")


def experiment_runs(client, name):
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        fail(f"no experiment {name}")
    return client.search_runs([experiment.experiment_id], max_results=1000)


def main():
    uri, mode = sys.argv[1], sys.argv[2]
    client = MlflowClient(tracking_uri=uri)
    if mode == "quickstart":
        runs = experiment_runs(client, "quickstart")
        if len(runs) != 1:
            fail(f"{len(runs)} runs in the experiment quickstart, expected 1")
        # The quickstart reports its epoch (from 0) and loss once per epoch, 20 epochs, no checkpoint.
        check_run(client, runs[0], {"lr": "0.1", "epochs": "20"}, 20, 2, metrics=("loss", "epoch"), first_epoch=0,
                  checkpoints=False)
        print("ok: the quickstart's run: params, 20 steps of 2 metrics, tags")
        return
    name, steps = sys.argv[3], int(sys.argv[4])
    runs = experiment_runs(client, "cohort-tests")
    if mode == "run":
        mine = [r for r in runs if r.info.run_name == name]
        if len(mine) != 1:
            fail(f"{len(mine)} runs named {name}, expected 1")
        check_run(client, mine[0], {"lr": "0.1", "model/width": "64", "model/kind": "mlp"}, steps, 2)
        print(f"ok: run {name}: params, {steps} steps of 3 metrics, tags")
        return
    parents = [r for r in runs if r.info.run_name == name]
    if len(parents) != 1:
        fail(f"{len(parents)} parent runs named {name}, expected 1")
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    if sorted(r.info.run_name for r in children) != [f"trial_{i:05d}" for i in range(4)]:
        fail(f"nested runs {sorted(r.info.run_name for r in children)}, expected trial_00000..trial_00003")
    lrs = set()
    for child in children:
        lrs.add(child.data.params.get("lr"))
        check_run(client, child, {}, steps, 2)
    if lrs != {"0.1", "0.2", "0.3", "0.4"}:
        fail(f"the trials' lr params are {sorted(lrs)}, expected 0.1, 0.2, 0.3, 0.4")
    if parent.info.status != "FINISHED":
        fail(f"parent run status {parent.info.status}")
    print(f"ok: sweep {name}: a parent run and 4 nested trial runs, params, {steps} steps each, tags")


main()
