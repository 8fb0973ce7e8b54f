"""PyTorch's side of bench/gpu_step.cpp: the step time of a plain PyTorch loop vs the same loop on
the model wrapped in DistributedDataParallel, in the same process with the same settings (TF32
matmuls on: float32 matmul precision "high"), on one GPU:

  python gpu_step.py [--models small,large,transformer] [--rounds R] [--steps S] [--device auto|cuda|cpu]
  torchrun --standalone --nproc-per-node 1 gpu_step.py ...   (the same, the process group from torchrun)

Each model is trained two ways, each on its own copy (built after torch.manual_seed(1)), in
alternated rounds of S steps (so drift hits both alike; each way goes first in turn), after 5
warm-up steps each:
  plain   a hand-written loop: zero_grad, forward, cross-entropy, backward, SGD step (lr 0.01,
          momentum 0.9)
  ddp     the same loop on DistributedDataParallel(model) in a one-process process group (NCCL on
          a GPU, gloo on the CPU): one rank has no one to exchange gradients with, but DDP still
          runs its reducer (gradient buckets, an all-reduce per bucket from the autograd hooks),
          which is what a rank of a multi-GPU job pays per step but the network; the counterpart
          of gpu_step.cpp's cohort_nccl
A round's time is taken between two device synchronisations; the figure is the median over rounds
of the time per step (the upper median for an even count, as gpu_step.cpp). One JSON line per model
on stdout: both figures and DDP's overhead over plain, the plain step's phases as gpu_step.cpp
times them (zero_grad with the forward and the loss, backward, optimizer step: each between two
synchronisations, max(S, 5) steps after the rounds, medians; their sum exceeds the step), the
torch version and the GPU's name.
Models (as gpu_step.cpp): small = MLP 1024-256-256-10 (ReLU between), batch 64; large = MLP
1024-4x4096-10, batch 256; transformer = embedding 8192 x 768, 12 nn.TransformerEncoderLayer (d 768,
12 heads, feed-forward 3072, dropout 0, (sequence, batch) input), linear 768 -> 8192 (98M
parameters), batch 16, sequence 256, next-token targets; its forward and loss under autocast
bfloat16. Default steps per round: 200, 50, 10.
Without a GPU (or with --device cpu) it runs on the CPU (default: the small MLP only; the JSON then
says "device":"cpu" and the figures say nothing of the GPU).

One difference with the C++ side that is not the wrapper's: PyTorch's nn.MultiheadAttention calls
scaled_dot_product_attention (flash or memory-efficient kernels on a GPU), LibTorch's C++
MultiheadAttention multiplies and soft-maxes by hand; --attention math makes the Python side take
SDPA's math path, nearer the C++ one, when Python's plain figure is set beside C++'s.
"""
import argparse
import contextlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

WARMUP_STEPS = 5  # per variant: allocator, cuBLAS handles, autotuning


class MLP(nn.Module):
    """Linear layers with ReLU between (none after the last): gpu_step.cpp's mlp."""

    def __init__(self, inputs, hidden, outputs):
        super().__init__()
        widths = [inputs] + hidden
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], outputs)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class Transformer(nn.Module):
    """gpu_step.cpp's transformer: tokens (sequence, batch) -> logits (sequence * batch, vocab)."""
    vocab, width, heads, feed_forward, depth = 8192, 768, 12, 3072, 12

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.vocab, self.width)
        layer = nn.TransformerEncoderLayer(self.width, self.heads, dim_feedforward=self.feed_forward, dropout=0.0)
        # enable_nested_tensor only matters to the inference fast path (and warns without batch_first).
        self.encoder = nn.TransformerEncoder(layer, self.depth, enable_nested_tensor=False)
        self.head = nn.Linear(self.width, self.vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens))).reshape(-1, self.vocab)


def median(values):
    """The element at len // 2 of the sorted values, as gpu_step.cpp's median."""
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(device):
    """A process group for DDP: torchrun's (env://) where it launched us, else a one-process one."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("error: --device cuda: no GPU is visible to torch")
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name, make, x, y, bf16, steps, rounds, device, args):
    """Builds both variants of one model on `device`, times them in alternated rounds, returns the JSON."""
    x, y = x.to(device), y.to(device)

    def make_on_device():
        torch.manual_seed(1)
        return make().to(device)

    def forward_context():
        """The transformer's forward and loss: autocast bfloat16 (and SDPA's math path with
        --attention math); nothing for the MLPs (no autocast scope at all, as gpu_step.cpp)."""
        if not bf16:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
        if args.attention == "math":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        return stack

    def make_step(model):
        """The step function of `model` with its own optimizer; `mark(phase)`, where given, is
        called after each of its three phases."""
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(mark=None):
            opt.zero_grad()
            # The forward and the loss in bfloat16 where asked; the backward and the step outside.
            with forward_context():
                loss = F.cross_entropy(model(x), y)
            if mark:
                mark("forward")
            loss.backward()
            if mark:
                mark("backward")
            opt.step()
            if mark:
                mark("optimizer")
        return step

    plain_net = make_on_device()
    ddp_net = DistributedDataParallel(make_on_device(), device_ids=[device.index] if device.type == "cuda" else None,
                                      gradient_as_bucket_view=args.gradient_as_bucket_view)
    variants = [("plain", make_step(plain_net)), ("ddp", make_step(ddp_net))]
    ms_per_step = {n: [] for n, _ in variants}
    for _, step in variants:
        for _ in range(WARMUP_STEPS):
            step()
    synchronize(device)
    for r in range(rounds):
        for k in range(len(variants)):
            n, step = variants[(r + k) % len(variants)]  # each goes first in turn
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize(device)
            ms_per_step[n].append((time.perf_counter() - t0) * 1000 / steps)
    # The plain step's phases, each between two device synchronisations (as gpu_step.cpp).
    phases = {"forward": [], "backward": [], "optimizer": []}
    clock = [0.0]

    def mark(phase):
        synchronize(device)
        now = time.perf_counter()
        phases[phase].append((now - clock[0]) * 1000)
        clock[0] = now
    for _ in range(max(steps, 5)):
        synchronize(device)
        clock[0] = time.perf_counter()
        variants[0][1](mark)
    plain_ms, ddp_ms = median(ms_per_step["plain"]), median(ms_per_step["ddp"])
    out = {"model": name, "parameters": sum(p.numel() for p in plain_net.parameters()), "device": str(device),
           "steps_per_round": steps, "rounds": rounds, "plain_ms": plain_ms, "ddp_ms": ddp_ms,
           "ddp_overhead_pct": (ddp_ms / plain_ms - 1) * 100 if plain_ms > 0 else None,
           "plain_forward_ms": median(phases["forward"]), "plain_backward_ms": median(phases["backward"]),
           "plain_optimizer_ms": median(phases["optimizer"]),
           "ranks": dist.get_world_size(), "ddp_gradient_as_bucket_view": args.gradient_as_bucket_view}
    if bf16:
        out["attention"] = args.attention
    out["torch"] = torch.__version__
    out["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="", help="comma-separated: small, large, transformer (default: all three on "
                                                "a GPU, small on the CPU)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=0, help="steps per round (0: 200 small, 50 large, 10 transformer)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--attention", choices=["default", "math"], default="default",
                   help="transformer: SDPA's own choice of kernel, or its math path (nearer LibTorch's C++ attention)")
    p.add_argument("--gradient-as-bucket-view", action="store_true",
                   help="DDP(gradient_as_bucket_view=True): the gradients are views into the buckets (no copy in)")
    args = p.parse_args()
    if args.rounds < 1 or args.steps < 0:
        raise SystemExit("error: --rounds must be at least 1 and --steps at least 0")
    device = pick_device(args.device)
    models = [m for m in args.models.split(",") if m] or (
        ["small", "large", "transformer"] if device.type == "cuda" else ["small"])
    for m in models:
        if m not in ("small", "large", "transformer"):
            raise SystemExit(f"error: unknown model {m}: use small, large or transformer")
    torch.set_float32_matmul_precision("high")  # TF32 matmuls, as gpu_step.cpp sets for both its sides
    init_group(device)
    rank = dist.get_rank()
    torch.manual_seed(0)  # the inputs (the models' weights come from seed 1)
    try:
        for m in models:
            steps = args.steps
            if m == "small":
                r = measure("mlp 1024-256-256-10, batch 64", lambda: MLP(1024, [256, 256], 10),
                            torch.randn(64, 1024), torch.randint(0, 10, (64,)), False, steps or 200, args.rounds,
                            device, args)
            elif m == "large":
                r = measure("mlp 1024-4x4096-10, batch 256", lambda: MLP(1024, [4096] * 4, 10),
                            torch.randn(256, 1024), torch.randint(0, 10, (256,)), False, steps or 50, args.rounds,
                            device, args)
            else:
                tokens = torch.randint(0, Transformer.vocab, (257, 16))
                r = measure("transformer 98M bf16, batch 16, sequence 256", Transformer, tokens[:256],
                            tokens[1:257].reshape(-1), True, steps or 10, args.rounds, device, args)
            if rank == 0:
                print(json.dumps(r), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the next model's copies start from a clean cache
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
