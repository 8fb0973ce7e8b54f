"""The tuning half of bench/compare/run: Ray Tune vs cohort::tuner, both at 2 trials at a time
(cohort: mpirun -np 2, one rank per trial; Ray: ray.init(num_cpus=2), one CPU per trial).

1. Bookkeeping, with a trainable that does nothing but report (storage: the output folder):
   ms per trial   cohort: bench_tune's trials/10000; Ray: Tuner.fit() of N one-report trials / N
                  (ray.init's start-up is left out and shown on its own)
   results per s  cohort: bench_tune's results/25000 (4 trials under ASHA); Ray: 4 trials of R
                  reports each under ASHA (max_t R+1, grace 1, reduction 4), results / fit time
2. A small real sweep, the same on both sides: examples/tune_fashion_mnist.cpp's search space (lr
   loguniform 0.01-0.2, momentum uniform 0.8-0.95, batch 32/64/128), random search, ASHA (max_t =
   epochs, grace 1, reduction 3) on test accuracy, a checkpoint per epoch, the same CNN, cosine
   learning rate and data; best test accuracy and wall time from launch to exit.
Each figure is the median of --rounds runs, the two sides alternating.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def ray_bookkeeping(storage, trials, reports):
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t0

    def noop(config):
        tune.report({"score": config["x"]})

    t0 = time.perf_counter()
    tune.Tuner(noop, param_space={"x": tune.uniform(0, 1)},
               tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=trials),
               run_config=tune.RunConfig(name="trials", storage_path=storage, verbose=0)).fit()
    ms_per_trial = (time.perf_counter() - t0) * 1e3 / trials

    def many(config):
        for _ in range(reports):
            tune.report({"score": config["x"]})

    t0 = time.perf_counter()
    tune.Tuner(many, param_space={"x": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
               tune_config=tune.TuneConfig(metric="score", mode="max",
                                           scheduler=ASHAScheduler(max_t=reports + 1, grace_period=1, reduction_factor=4)),
               run_config=tune.RunConfig(name="results", storage_path=storage, verbose=0)).fit()
    results_per_s = 4 * reports / (time.perf_counter() - t0)
    ray.shutdown()
    return {"ray_init_s": init_s, "ms_per_trial": ms_per_trial, "results_per_s": results_per_s,
            "trials": trials, "reports_per_trial": reports}


def ray_sweep(storage, samples, epochs, max_train, data):
    """Ray Tune's side of the real sweep (run in its own process, timed from outside)."""
    import math
    import ray
    import torch
    import torch.nn.functional as F
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    sys.path.insert(0, HERE)
    from train_torch import FashionNet, accuracy, load

    def trial(config):
        torch.set_num_threads(1)
        torch.manual_seed(0)
        x, y = load(data, "train", max_train)
        tx, ty = load(data, "t10k")
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=config["batch_size"],
                                             shuffle=True, drop_last=True)
        net = FashionNet()
        opt = torch.optim.SGD(net.parameters(), lr=config["lr"], momentum=config["momentum"])
        for epoch in range(config["max_epochs"]):
            lr = config["lr"] * 0.5 * (1 + math.cos(math.pi * epoch / config["max_epochs"]))
            for g in opt.param_groups:
                g["lr"] = lr
            net.train()
            for xb, yb in loader:
                opt.zero_grad()
                F.cross_entropy(net(xb), yb).backward()
                opt.step()
            acc = accuracy(net, tx, ty)
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
                tune.report({"epoch": epoch, "test_accuracy": acc}, checkpoint=tune.Checkpoint.from_directory(d))

    ray.init(num_cpus=2, include_dashboard=False)
    grid = tune.Tuner(trial, param_space={"lr": tune.loguniform(0.01, 0.2), "momentum": tune.uniform(0.8, 0.95),
                                          "batch_size": tune.choice([32, 64, 128]), "max_epochs": epochs},
                      tune_config=tune.TuneConfig(metric="test_accuracy", mode="max", num_samples=samples,
                                                  scheduler=ASHAScheduler(max_t=epochs, grace_period=1, reduction_factor=3)),
                      run_config=tune.RunConfig(name="sweep", storage_path=storage, verbose=0,
                                                checkpoint_config=tune.CheckpointConfig(num_to_keep=1))).fit()
    best = grid.get_best_result()
    print(json.dumps({"event": "sweep", "test_accuracy": best.metrics["test_accuracy"], "trials": len(grid)}), flush=True)
    ray.shutdown()


def timed(cmd, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {p.returncode}):\n" + "\n".join(p.stdout.splitlines()[-25:]))
    return wall, p.stdout


def last_json(out, key):
    for line in reversed(out.splitlines()):
        line = line[line.find("{"):] if "{" in line else ""
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if key in row:
            return row
    raise SystemExit(f"error: no JSON line with {key!r} in:\n{out[-2000:]}")


def cohort_bookkeeping(build, storage, mpirun):
    env = dict(os.environ, TMPDIR=storage)
    _, out = timed([mpirun, "-np", "2", os.path.join(build, "bench", "bench_tune")], env)
    last = {}  # the last column of each benchmark's row: ms_per_trial, results_per_s ("87.831k")
    for line in re.sub(r"\x1b\[[0-9;]*m", "", out).splitlines():  # its console reporter colours always
        if line.startswith(("trials/", "results/")):
            value = line.split()[-1]
            last[line.split("/")[0]] = float(value[:-1]) * {"k": 1e3, "M": 1e6}[value[-1]] if value[-1] in "kM" else float(value)
    if set(last) != {"trials", "results"}:
        raise SystemExit(f"error: bench_tune printed no trials and results rows:\n{out[-2000:]}")
    return {"ms_per_trial": last["trials"], "results_per_s": last["results"], "trials": 10000, "reports_per_trial": 25000}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", help="cohort's build folder (bench_tune, examples/tune_fashion_mnist)")
    p.add_argument("--out", help="folder for tune.json and tune.md")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--ray-trials", type=int, default=50)
    p.add_argument("--ray-reports", type=int, default=1000)
    p.add_argument("--samples", type=int, default=6)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-train", type=int, default=4096)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--ray-sweep", metavar="STORAGE", help=argparse.SUPPRESS)  # the Ray sweep's own process
    p.add_argument("--ray-bookkeeping", metavar="STORAGE", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.ray_sweep:
        return ray_sweep(a.ray_sweep, a.samples, a.epochs, a.max_train, a.data)
    if a.ray_bookkeeping:
        print(json.dumps({"event": "bookkeeping"} | ray_bookkeeping(a.ray_bookkeeping, a.ray_trials, a.ray_reports)), flush=True)
        return 0
    if not a.build or not a.out:
        p.error("--build and --out are needed")
    os.makedirs(a.out, exist_ok=True)
    runs = {"cohort_bookkeeping": [], "ray_bookkeeping": [], "cohort_sweep": [], "ray_sweep": []}
    me = [sys.executable, os.path.abspath(__file__)]
    sweep = ["--samples", str(a.samples), "--epochs", str(a.epochs), "--max-train", str(a.max_train)]
    for r in range(a.rounds):
        storage = os.path.join(os.path.abspath(a.out), "tune_storage")
        shutil.rmtree(storage, ignore_errors=True)
        os.makedirs(storage)
        order = ["cohort", "ray"] if r % 2 == 0 else ["ray", "cohort"]
        for side in order:
            if side == "cohort":
                runs["cohort_bookkeeping"].append(cohort_bookkeeping(a.build, storage, a.mpirun))
                wall, out = timed([a.mpirun, "-np", "2", os.path.join(a.build, "examples", "tune_fashion_mnist"),
                                   "--samples", str(a.samples), "--max-epochs", str(a.epochs), "--max-train", str(a.max_train),
                                   "--data", a.data, "--budget-s", "100000", "--storage", storage, "--name", f"sweep_{r}"])
                best = last_json(out, "test_accuracy")
                runs["cohort_sweep"].append({"wall_s": wall, "best_test_accuracy": best["test_accuracy"], "trials": best["trials"]})
            else:
                _, out = timed([*me, "--ray-bookkeeping", storage, "--ray-trials", str(a.ray_trials), "--ray-reports", str(a.ray_reports)])
                runs["ray_bookkeeping"].append(last_json(out, "ms_per_trial"))
                wall, out = timed([*me, "--ray-sweep", storage, *sweep, "--data", a.data])
                best = last_json(out, "test_accuracy")
                runs["ray_sweep"].append({"wall_s": wall, "best_test_accuracy": best["test_accuracy"], "trials": best["trials"]})
            print(f"round {r + 1}/{a.rounds} {side}: {runs[side + '_bookkeeping'][-1]['ms_per_trial']:.3f} ms/trial, "
                  f"{runs[side + '_bookkeeping'][-1]['results_per_s']:.0f} results/s; sweep {runs[side + '_sweep'][-1]['wall_s']:.1f} s, "
                  f"best {runs[side + '_sweep'][-1]['best_test_accuracy']:.4f}", flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0] if isinstance(v[0][m], (int, float))} for k, v in runs.items()}
    lines = ["| measure | cohort::tuner | Ray Tune | Ray / cohort |", "|---|---:|---:|---:|",
             f"| bookkeeping per trial (ms) | {med['cohort_bookkeeping']['ms_per_trial']:.3f} | {med['ray_bookkeeping']['ms_per_trial']:.1f} | "
             f"{med['ray_bookkeeping']['ms_per_trial'] / med['cohort_bookkeeping']['ms_per_trial']:.0f}x |",
             f"| results per second | {med['cohort_bookkeeping']['results_per_s']:.0f} | {med['ray_bookkeeping']['results_per_s']:.0f} | "
             f"{med['ray_bookkeeping']['results_per_s'] / med['cohort_bookkeeping']['results_per_s']:.3f} |",
             f"| sweep ({a.samples} trials, ASHA, {a.epochs} epochs of {a.max_train} images): wall time (s) | "
             f"{med['cohort_sweep']['wall_s']:.1f} | {med['ray_sweep']['wall_s']:.1f} | {med['ray_sweep']['wall_s'] / med['cohort_sweep']['wall_s']:.2f} |",
             f"| sweep: best test accuracy | {med['cohort_sweep']['best_test_accuracy']:.4f} | {med['ray_sweep']['best_test_accuracy']:.4f} | |",
             f"| Ray's ray.init() start-up, not in the rows above (s) | | {med['ray_bookkeeping']['ray_init_s']:.2f} | |"]
    md = "\n".join(lines)
    with open(os.path.join(a.out, "tune.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "rounds": a.rounds, "runs": runs, "median": med}, f, indent=1)
    with open(os.path.join(a.out, "tune.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
