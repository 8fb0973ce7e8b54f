"""Runs the training comparison of bench/compare/run and writes its tables, JSON and plot.

Systems, each on the same CNN, data, batch per rank, optimizer, epochs and threads per rank:
  cohort       mpirun --bind-to none -np N compare_cohort_cnn
  ddp          torchrun --standalone --nproc-per-node N train_torch.py ddp
  ray          python train_torch.py ray --workers N   (Ray Train's TorchTrainer)
  cpp_plain    compare_cohort_cnn --plain              (one process, LibTorch alone: cohort's baseline)
  python_plain python train_torch.py plain             (one process, no DDP: DDP's and Ray's baseline)
Measured per run: launch to first step (from just before the launch to the end of rank 0's first
optimizer step), steady samples/s (all ranks, after 10 warm-up steps), peak RSS summed over every
process of the system (the launcher, every rank, and for Ray its GCS, raylet, dashboard and
workers: all processes the launch started, sampled every 0.2 s), final test accuracy. The runs
alternate between systems; each figure is the median over the rounds.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import psutil

EVENT = re.compile(r'(\{"event": ?"[a-z_]+".*\})')


def is_ray_process(cmdline):
    """A process Ray started: its GCS, raylet, workers (ray::...) or a script from its package."""
    cmd = " ".join(cmdline or [])
    return "ray" in cmd and ("raylet" in cmd or "gcs_server" in cmd or "ray::" in cmd or "/ray/" in cmd)


def rss_sampler(root_pid, known, stop, peak):
    """Peak of the summed RSS of root_pid's descendants and of any new Ray process."""
    while not stop.is_set():
        total = 0
        pids = set()
        try:
            root = psutil.Process(root_pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            pids.add(p.pid)
        for p in psutil.process_iter(["pid", "cmdline"]):
            if p.pid in known or p.pid in pids:
                continue
            if is_ray_process(p.info["cmdline"]):
                procs.append(p)
                pids.add(p.pid)
        for p in procs:
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        peak[0] = max(peak[0], total)
        stop.wait(0.2)


def leftover_ray(known):
    return [p for p in psutil.process_iter(["pid", "cmdline"])
            if p.pid not in known and p.pid != os.getpid() and is_ray_process(p.info["cmdline"])]


def run_once(cmd, env, cwd, timeout_s):
    known = set(psutil.pids())
    stop, peak = threading.Event(), [0]
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    sampler = threading.Thread(target=rss_sampler, args=(proc.pid, known, stop, peak), daemon=True)
    sampler.start()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n(killed after {timeout_s} s)"
    stop.set()
    sampler.join()
    for p in leftover_ray(known):  # a Ray daemon that outlived its driver
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    events = {}
    for line in out.splitlines():
        m = EVENT.search(line)
        if m:
            e = json.loads(m.group(1))
            events[e["event"]] = e
    if proc.returncode != 0 or "first_step" not in events or "done" not in events:
        tail = "\n".join(out.splitlines()[-25:])
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    done = events["done"]
    return {"launch_to_first_step_s": events["first_step"]["wall_s"] - t0,
            "steady_samples_per_s": done["steady_samples_per_s"],
            "peak_rss_mib": peak[0] / 2**20,
            "test_accuracy": done["test_accuracy"],
            "wall_s": time.time() - t0,
            "version": done.get("libtorch") or done.get("torch")}


def commands(a, system, ranks, storage):
    train = ["--data", a.data, "--epochs", str(a.epochs), "--max-train", str(a.max_train), "--batch", str(a.batch)]
    py = [a.python, os.path.join(a.here, "train_torch.py")]
    if system == "cohort":
        # No binding, as torchrun and Ray place their processes: Open MPI binds each rank to a core
        # by default (at 1 rank, one core of two), and threads per rank must match.
        return [a.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(ranks), a.cohort_bin, *train, "--storage", storage]
    if system == "cpp_plain":
        return [a.cohort_bin, "--plain", *train]
    if system == "python_plain":
        return [*py, "plain", *train]
    if system == "ddp":
        return [a.torchrun, "--standalone", f"--nproc-per-node={ranks}", os.path.join(a.here, "train_torch.py"), "ddp", *train]
    if system == "ray":
        return [*py, "ray", "--workers", str(ranks), "--storage", storage, *train]
    raise ValueError(system)


def median_row(runs):
    keys = ["launch_to_first_step_s", "steady_samples_per_s", "peak_rss_mib", "test_accuracy", "wall_s"]
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {"runs": len(runs), "version": runs[0]["version"]}


def table(results, sizes):
    lines = ["| system | ranks | launch to first step (s) | steady samples/s | vs DDP | peak RSS, all processes (MiB) | test accuracy | runs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for system in ["cohort", "ddp", "ray", "cpp_plain", "python_plain"]:
        for n in sizes if "plain" not in system else [1]:
            key = f"{system}/{n}"
            if key not in results:
                continue
            m = results[key]["median"]
            ddp = results.get(f"ddp/{n}", {}).get("median")
            ratio = f"{m['steady_samples_per_s'] / ddp['steady_samples_per_s']:.2f}" if ddp else ""
            lines.append(f"| {system} | {n} | {m['launch_to_first_step_s']:.2f} | {m['steady_samples_per_s']:.0f} | {ratio} | "
                         f"{m['peak_rss_mib']:.0f} | {m['test_accuracy']:.4f} | {m['runs']} |")
    return "\n".join(lines)


def plot(results, sizes, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    measures = [("steady_samples_per_s", "steady samples/s"), ("launch_to_first_step_s", "launch to first step (s)"),
                ("peak_rss_mib", "peak RSS, all processes (MiB)")]
    for ax, (key, label) in zip(axes, measures):
        for system, style in [("cohort", "o-"), ("ddp", "s-"), ("ray", "^-")]:
            xs = [n for n in sizes if f"{system}/{n}" in results]
            ax.plot(xs, [results[f"{system}/{n}"]["median"][key] for n in xs], style, label=system)
        for system, style in [("cpp_plain", "k--"), ("python_plain", "k:")]:
            if f"{system}/1" in results:
                ax.axhline(results[f"{system}/1"]["median"][key], linestyle=style[1:], color="k", linewidth=1,
                           label=f"{system} (1 process)")
        ax.set_xlabel("ranks")
        ax.set_xticks(sizes)
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cohort-bin", required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--torchrun", required=True)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-train", type=int, default=6400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--sizes", default="1,2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--systems", default="cohort,ddp,ray")
    p.add_argument("--timeout-s", type=int, default=600)
    p.add_argument("--out", required=True, help="folder for compare.json, compare.md and compare.png")
    a = p.parse_args()
    a.here = os.path.dirname(os.path.abspath(__file__))
    sizes = [int(s) for s in a.sizes.split(",")]
    systems = a.systems.split(",")
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
    plan = [(s, n) for n in sizes for s in systems] + [("cpp_plain", 1), ("python_plain", 1)]
    runs = {}
    for r in range(a.rounds):
        order = plan[r % len(plan):] + plan[:r % len(plan)]  # each round starts elsewhere
        for system, n in order:
            storage = os.path.join(a.out, "runs", f"{system}_{n}_{r}")
            res = run_once(commands(a, system, n, storage), env, a.out, a.timeout_s)
            runs.setdefault(f"{system}/{n}", []).append(res)
            print(f"round {r + 1}/{a.rounds} {system:>12} ranks {n}: first step {res['launch_to_first_step_s']:.2f} s, "
                  f"{res['steady_samples_per_s']:.0f} samples/s, {res['peak_rss_mib']:.0f} MiB, "
                  f"accuracy {res['test_accuracy']:.4f}", flush=True)
    results = {k: {"runs": v, "median": median_row(v)} for k, v in runs.items()}
    meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "epochs": a.epochs, "max_train": a.max_train,
            "batch_per_rank": a.batch, "rounds": a.rounds, "sizes": sizes}
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    md = table(results, sizes)
    with open(os.path.join(a.out, "compare.md"), "w") as f:
        f.write(md + "\n")
    plot(results, sizes, os.path.join(a.out, "compare.png"))
    print(md)


if __name__ == "__main__":
    main()
