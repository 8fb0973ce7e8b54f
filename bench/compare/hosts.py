"""cohort against PyTorch DDP across hosts (bench/compare/hosts): two test hosts of scripts/hosts,
each a network namespace with its own share of this machine's cores, joined by a link shaped
with tc (tbf) to each rate in turn. Traffic goes only between the test hosts.

For each link rate:
  all-reduce    bench_gradient_sync, 1 rank per host: MPI_Allreduce and cohort's gradient
                synchronisation of 4 and 16 MiB, against the link's bound 2(N-1)/N x bytes / rate
  training      for each layout (ranks per host) and model (the reference CNN, 1.7 MB of gradients;
                the MLP, 23 MB), `rounds` pairs of runs, cohort (mpirun over the hosts) and DDP
                (torchrun on each host, gloo), alternating which goes first; steady samples/s
Per step, from the medians: step = global batch / samples/s; compute = the same ranks' share of a
plain one-process loop on one host (ranks per host x batch / its samples/s); exposed
communication = step - compute. --compression bf16|fp16: both sides' gradients travel as bfloat16 or
float16 (cohort's model_options::compression against DDP's bf16_compress_hook or fp16_compress_hook);
the all-reduce rows stay float32.
Writes hosts.json (every run), hosts.md (tables) and hosts.png (samples/s against link rate).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

BYTES = [4 << 20, 16 << 20]


def sh(cmd, timeout_s=900, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).splitlines()[-15:])
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {p.returncode}):\n{tail}")
    return p.stdout


def done_line(text):
    for line in text.splitlines():
        if line.startswith("{") and '"done"' in line:
            return json.loads(line)
    raise SystemExit("error: no done line in:\n" + text[-2000:])


def rate_bits(link):
    if link == "unshaped":
        return None
    m = re.fullmatch(r"(\d+)(g|m)bit", link)
    return int(m.group(1)) * (10**9 if m.group(2) == "g" else 10**6)


class Hosts:
    def __init__(self, a):
        self.a = a
        self.dir = sh([a.hosts, "up", a.set, str(a.slots), str(a.slots)]).strip().splitlines()[-1]
        cores = len(os.sched_getaffinity(0))
        half = max(1, cores // 2)
        # Each host its own cores, as two machines: the first half of this one's and the rest.
        sh([a.hosts, "cpus", a.set, "h1", f"0-{half - 1}"])
        sh([a.hosts, "cpus", a.set, "h2", f"{half}-{max(half, cores - 1)}" if cores > 1 else "0"])
        self.port = 29600

    def link(self, rate):
        sh([self.a.hosts, "link", self.a.set, rate])

    def mpirun(self, ranks_per_host, program):
        passed = [x for v in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") if v in os.environ for x in ("-x", v)]
        return [os.path.join(self.dir, "mpirun"), *passed, "--hostfile", os.path.join(self.dir, "hostfile"),
                "-np", str(2 * ranks_per_host), "--map-by", f"ppr:{ranks_per_host}:node", "--bind-to", "none", *program]

    def ddp(self, ranks_per_host, args):
        self.port += 1
        procs = []
        for k in (1, 2):
            cmd = [self.a.hosts, "exec", self.a.set, f"h{k}", "env", "GLOO_SOCKET_IFNAME=eth0", self.a.torchrun,
                   "--nnodes", "2", f"--nproc-per-node={ranks_per_host}", f"--node-rank={k - 1}",
                   "--master-addr", "10.77.0.1", f"--master-port={self.port}", self.a.train_torch, "ddp", *args]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode != 0 for p in procs):  # each host's own lines: torchrun's summary names only one
            raise SystemExit("error: DDP run failed:\n" + "\n".join(
                f"--- h{k}, exit {p.returncode}:\n" + "\n".join(o.splitlines()[-40:]) for k, (p, o) in enumerate(zip(procs, outs), 1)))
        return done_line(outs[0])

    def down(self):
        subprocess.run([self.a.hosts, "down", self.a.set])


def sync_rows(a, hosts, link):
    out = sh(hosts.mpirun(1, [a.gradient_sync, "--benchmark_filter=/(" + "|".join(map(str, BYTES)) + ")/"]))
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit() and int(cells[0]) in BYTES:
            b = int(cells[0])
            bits = rate_bits(link)
            bound_ms = 2 * (2 - 1) / 2 * b * 8 / bits * 1e3 if bits else None
            rows.append({"link": link, "bytes": b, "raw_ms": float(cells[1]) / 1e3, "cohort_ms": float(cells[2]) / 1e3,
                         "bound_ms": bound_ms})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--hosts", "--cohort-bin", "--gradient-sync", "--torchrun", "--train-torch", "--out", "--data"):
        p.add_argument(flag, required=flag != "--data")
    p.add_argument("--links", default="unshaped,10gbit,1gbit,200mbit")
    p.add_argument("--layouts", default="1,2", help="ranks per host")
    p.add_argument("--models", default="cnn,mlp")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", default="bench")
    p.add_argument("--compression", choices=["none", "bf16", "fp16"], default="none",
                   help="both sides' gradients all-reduced as bfloat16 or float16 (cohort's model_options::compression, "
                        "DDP's bf16_compress_hook or fp16_compress_hook)")
    a = p.parse_args()
    a.slots = max(int(x) for x in a.layouts.split(","))
    data = ["--data", a.data] if a.data else []
    steps = {"cnn": 100, "mlp": 30}  # per rank, 10 of them warm-up
    hosts = Hosts(a)
    runs, sync, plain = [], [], {}
    try:
        for model in a.models.split(","):  # the compute share: a plain loop on host 1's cores, unshaped
            hosts.link("unshaped")
            out = sh([a.hosts, "exec", a.set, "h1", a.cohort_bin, "--plain", "--model", model,
                      "--max-train", str(64 * steps[model]), *data])
            plain[model] = done_line(out)["steady_samples_per_s"]
        for link in a.links.split(","):
            hosts.link(link)
            sync += sync_rows(a, hosts, link)
            for layout in map(int, a.layouts.split(",")):
                for model in a.models.split(","):
                    args = ["--model", model, "--max-train", str(64 * 2 * layout * steps[model]), *data,
                            "--compression", a.compression]
                    for r in range(a.rounds):
                        for system in (("cohort", "ddp") if r % 2 == 0 else ("ddp", "cohort")):
                            if system == "cohort":
                                d = done_line(sh(hosts.mpirun(layout, [a.cohort_bin, *args, "--storage", os.path.join(a.out, "runs")])))
                            else:
                                d = hosts.ddp(layout, args)
                            runs.append({"link": link, "ranks_per_host": layout, "model": model, "system": system,
                                         "round": r, "samples_per_s": d["steady_samples_per_s"]})
                            print(json.dumps(runs[-1]), flush=True)
    finally:
        hosts.down()
    report(a, runs, sync, plain)


def report(a, runs, sync, plain):
    def med(**k):
        xs = [r["samples_per_s"] for r in runs if all(r[x] == v for x, v in k.items())]
        return statistics.median(xs) if xs else None

    rows = []
    for link in a.links.split(","):
        for layout in map(int, a.layouts.split(",")):
            for model in a.models.split(","):
                c, d = med(link=link, ranks_per_host=layout, model=model, system="cohort"), med(
                    link=link, ranks_per_host=layout, model=model, system="ddp")
                if c is None or d is None:
                    continue
                global_batch = 64 * 2 * layout
                compute = layout * 64 / plain[model]
                rows.append({"link": link, "ranks_per_host": layout, "model": model, "cohort": c, "ddp": d, "ratio": c / d,
                             "compute_ms": compute * 1e3, "cohort_step_ms": global_batch / c * 1e3,
                             "ddp_step_ms": global_batch / d * 1e3})
    with open(os.path.join(a.out, "hosts.json"), "w") as f:
        json.dump({"runs": runs, "sync": sync, "plain_samples_per_s": plain, "rows": rows, "compression": a.compression,
                   "date": time.strftime("%Y-%m-%d")}, f, indent=1)
    md = ["| link | hosts x ranks | model | cohort samples/s | DDP samples/s | cohort / DDP | compute ms/step | "
          "exposed comm. ms/step, cohort | DDP |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['link']} | 2 x {r['ranks_per_host']} | {r['model']} | {r['cohort']:.0f} | {r['ddp']:.0f} | "
                  f"**{r['ratio']:.2f}** | {r['compute_ms']:.1f} | {r['cohort_step_ms'] - r['compute_ms']:.1f} | "
                  f"{r['ddp_step_ms'] - r['compute_ms']:.1f} |")
    md += ["", "| link | bytes | bound ms | MPI_Allreduce ms | cohort sync ms | cohort / bound |", "|---|---:|---:|---:|---:|---:|"]
    for s in sync:
        b = s["bound_ms"]
        md.append(f"| {s['link']} | {s['bytes'] >> 20} MiB | {b:.1f} | {s['raw_ms']:.1f} | {s['cohort_ms']:.1f} | "
                  f"{s['cohort_ms'] / b:.2f} |" if b else
                  f"| {s['link']} | {s['bytes'] >> 20} MiB | - | {s['raw_ms']:.1f} | {s['cohort_ms']:.1f} | - |")
    text = "\n".join(md) + "\n"
    with open(os.path.join(a.out, "hosts.md"), "w") as f:
        f.write(text)
    print(text)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shaped = [l for l in a.links.split(",") if rate_bits(l)]
    shaped.sort(key=rate_bits)
    fig, axes = plt.subplots(1, len(a.models.split(",")), figsize=(6 * len(a.models.split(",")), 4), squeeze=False)
    for ax, model in zip(axes[0], a.models.split(",")):
        for layout in map(int, a.layouts.split(",")):
            for system, style in (("cohort", "-o"), ("ddp", "--s")):
                ys = [med(link=l, ranks_per_host=layout, model=model, system=system) for l in shaped]
                ax.plot([rate_bits(l) / 1e9 for l in shaped], ys, style, label=f"{system}, 2 hosts x {layout}")
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Gbit/s)")
        ax.set_ylabel("samples/s")
        ax.set_title(model)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "hosts.png"), dpi=110)


if __name__ == "__main__":
    sys.exit(main())
