"""The comparison's PyTorch side (bench/compare/run): the reference Fashion-MNIST CNN of
examples/fashion_mnist_net.hpp, trained as bench/compare/cohort_cnn.cpp trains it (same layers,
data files and normalisation, batch per rank, SGD lr 0.05 momentum 0.9, epochs, threads per rank,
10 warm-up steps left out of the rate), in one of three ways:

  python train_torch.py plain ...               one process, no DDP: the Python baseline
  torchrun --nproc-per-node N train_torch.py ddp ...   PyTorch DDP over gloo (NCCL with --device cuda)
                                                  (--compression bf16|fp16: DDP's bf16_compress_hook or
                                                  fp16_compress_hook, as cohort's model_options::compression)
  python train_torch.py ray --workers N ...     Ray Train's TorchTrainer (DDP over gloo inside)

Rank 0 prints the same JSON lines as the C++ side:
  {"event":"first_step","wall_s":...}   wall clock (Unix seconds) when the first step ended
  {"event":"done","steady_samples_per_s":...,"test_accuracy":...,"ranks":...,"torch":"...",
   "epoch_s":...,"device":"..."}
epoch_s is the mean wall time of a whole epoch (data loading included), over the epochs after the
first when there are at least 2, else the one epoch's.
The loop is what a PyTorch user writes: a TensorDataset, a DataLoader with a DistributedSampler
(shuffled per epoch with set_epoch), DistributedDataParallel.

--device cuda (plain and ddp) trains on the GPU (ddp: cuda:LOCAL_RANK, over NCCL): the model on the
device, each batch made by the DataLoader on the CPU in pinned memory and copied with
non_blocking=True; the clock is read after a device synchronisation where it is read for a figure
(the first step, the end of the warm-up, the end of each epoch), so the steps between queue freely.
examples/fashion_mnist.cpp's defaults (lr 0.05, momentum 0.9, batch 64 per rank, 4 epochs, all
60,000 training images) are --epochs 4 (with the other defaults); add --like-fit-loop to also do what
its cohort::fit_loop does besides the steps: read each step's loss and correct count back
(.item()) and score the test set (this rank's slice, batches of 128) after every epoch, in the
epoch's time. The data folder: --data, else $FASHION_MNIST_DIR, else the Debian package's.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class FashionNet(nn.Module):
    """conv 1->32 3x3 pad 1, batch norm, ReLU, max-pool 2; conv 32->64 the same; linear 3136->128,
    ReLU; linear 128->10 (examples/fashion_mnist_net.hpp)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"error: {path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split, max_n=0):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    if max_n > 0:
        images, labels = images[:max_n], labels[:max_n]
    x = torch.from_numpy(images.astype(np.float32)).unsqueeze(1).div_(255.0).sub_(0.2860).div_(0.3530)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def accuracy(net, x, y):
    """The share of (x, y) the net classifies right, in batches of 128 moved to the net's device
    (the set stays on the CPU, as the C++ side's count_correct)."""
    net.eval()
    device = next(net.parameters()).device
    correct = 0
    with torch.no_grad():
        for b in range(0, x.shape[0], 128):  # the C++ side's evaluation batch
            correct += (net(x[b:b + 128].to(device)).argmax(1) == y[b:b + 128].to(device)).sum().item()
    return correct / x.shape[0]


def emit(event):
    print(json.dumps(event), flush=True)


class WideMLP(nn.Module):
    """784 -> 2048 -> 2048 -> 10 with ReLUs (bench/compare/cohort_cnn.cpp's --model mlp): 23 MB of
    gradients per step, where the all-reduce sets the pace."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 2048)
        self.fc2 = nn.Linear(2048, 2048)
        self.fc3 = nn.Linear(2048, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def train_loop(cfg, rank, world, wrap_model, wrap_loader, report=None, device=torch.device("cpu")):
    """The loop every variant runs; wrap_model/wrap_loader add DDP and the sampler (and
    wrap_model receives the model already on `device`)."""
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    x, y = load(cfg["data"], "train", cfg["max_train"])
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = wrap_loader(dataset, cfg["batch"])
    net = wrap_model((WideMLP if cfg.get("model") == "mlp" else FashionNet)().to(device))
    opt = torch.optim.SGD(net.parameters(), lr=cfg.get("lr", 0.05), momentum=0.9)
    on_gpu = device.type == "cuda"
    like_fit_loop = cfg.get("like_fit_loop", False)
    if like_fit_loop:  # this rank's slice of the test set, scored after every epoch as fit_loop validates
        tx, ty = load(cfg["data"], "t10k")
        per = (tx.shape[0] + world - 1) // world
        tx, ty = tx[rank * per:(rank + 1) * per], ty[rank * per:(rank + 1) * per]
    steps, steady_start, steady_s = 0, 0.0, 0.0
    epoch_s = []
    for epoch in range(cfg["epochs"]):
        epoch_start = time.perf_counter()
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        net.train()
        for xb, yb in loader:
            if on_gpu:  # the loader pinned the batch: the copies queue behind the previous step
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            opt.zero_grad()
            if like_fit_loop:  # fit_loop's per-step metrics: the loss and the correct count, read back
                out = net(xb)
                loss = F.cross_entropy(out, yb)
                loss.backward()
                opt.step()
                loss.item()
                (out.argmax(1) == yb).sum().item()
            else:
                F.cross_entropy(net(xb), yb).backward()
                opt.step()
            steps += 1
            if rank == 0:
                if on_gpu and steps in (1, cfg["warmup_steps"]):
                    torch.cuda.synchronize()  # these two times are read as the GPU's, not the queue's
                now = time.perf_counter()
                if steps == 1:
                    emit({"event": "first_step", "wall_s": time.time()})
                if steps == cfg["warmup_steps"]:
                    steady_start = now
                if steps > cfg["warmup_steps"]:
                    steady_s = now - steady_start
        if on_gpu:
            torch.cuda.synchronize()  # the epoch's queued steps are done: the steady time ends here
            if rank == 0 and steps > cfg["warmup_steps"]:
                steady_s = time.perf_counter() - steady_start
        if like_fit_loop:  # the module itself: DDP's forward is for training steps (every rank alike)
            accuracy(net.module if hasattr(net, "module") else net, tx, ty)
        epoch_s.append(time.perf_counter() - epoch_start)  # nothing left queued on a GPU (synchronised above)
        if report:
            report({"epoch": epoch})
    if rank == 0:
        tx, ty = load(cfg["data"], "t10k")
        model = net.module if hasattr(net, "module") else net
        counted = steps - cfg["warmup_steps"]
        rate = counted * cfg["batch"] * world / steady_s if counted > 0 and steady_s > 0 else 0.0
        later = epoch_s[1:] or epoch_s  # the first epoch also pays first-touch costs: left out when there are more
        emit({"event": "done", "steady_samples_per_s": round(rate, 3), "test_accuracy": round(accuracy(model, tx, ty), 4),
              "ranks": world, "steps_per_rank": steps, "torch": torch.__version__,
              "epoch_s": round(sum(later) / len(later), 4) if later else 0.0, "device": str(device)})


def cuda_device(index):
    if not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no GPU is visible to torch")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def plain(cfg):
    device = cuda_device(0) if cfg["device"] == "cuda" else torch.device("cpu")
    pin = device.type == "cuda"  # batches in pinned memory, for asynchronous copies to the GPU

    def loader(dataset, batch):
        if pin:
            return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True, pin_memory=True)
        return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True)
    train_loop(cfg, 0, 1, lambda net: net, loader, device=device)


def ddp(cfg):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    if cfg["device"] == "cuda":  # one GPU per rank, NCCL between them
        device = cuda_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
        wrap = lambda net: DistributedDataParallel(net, device_ids=[device.index])  # noqa: E731
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        wrap = DistributedDataParallel
    if cfg["compression"] != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = default_hooks.bf16_compress_hook if cfg["compression"] == "bf16" else default_hooks.fp16_compress_hook
        plain_wrap = wrap

        def wrap(net):
            model = plain_wrap(net)
            model.register_comm_hook(None, hook)
            return model
    rank, world = dist.get_rank(), dist.get_world_size()

    def loader(dataset, batch):
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True, seed=42, drop_last=True)
        if device.type == "cuda":
            return torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True, pin_memory=True)
        return torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)
    train_loop(cfg, rank, world, wrap, loader, device=device)
    dist.destroy_process_group()


def ray_worker(cfg):
    import ray.train
    import ray.train.torch
    ctx = ray.train.get_context()

    def loader(dataset, batch):
        return ray.train.torch.prepare_data_loader(
            torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True), move_to_device=False)
    train_loop(cfg, ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.prepare_model, loader,
               report=ray.train.report)


def ray_main(cfg, workers, storage):
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    ray.init(num_cpus=max(workers, os.cpu_count() or 1), log_to_driver=True)
    trainer = TorchTrainer(ray_worker, train_loop_config=cfg,
                           scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
                           run_config=RunConfig(name="compare", storage_path=storage))
    trainer.fit()
    ray.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["plain", "ddp", "ray"])
    p.add_argument("--data", default=os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-train", type=int, default=0)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (0: cores / ranks on the node)")
    p.add_argument("--workers", type=int, default=1, help="ray: the number of training workers")
    p.add_argument("--storage", default=os.path.abspath("compare_runs"), help="ray: RunConfig.storage_path")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="plain and ddp: where the model trains")
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn", help="the reference CNN, or the 23 MB MLP")
    p.add_argument("--compression", choices=["none", "bf16", "fp16"], default="none",
                   help="ddp: gradients all-reduced as bfloat16 or float16 (DDP's compression hooks)")
    p.add_argument("--like-fit-loop", action="store_true",
                   help="also read each step's loss and correct count back and score the test set every epoch, "
                        "as cohort::fit_loop (examples/fashion_mnist.cpp) does")
    a = p.parse_args()
    if a.device == "cuda" and a.mode == "ray":
        raise SystemExit("error: --device cuda is for plain and ddp (ray runs its workers on the CPU)")
    world = {"plain": 1, "ddp": int(os.environ.get("WORLD_SIZE", "1")), "ray": a.workers}[a.mode]
    # The cores this process may use (its affinity: a host's share of a machine), shared by the
    # ranks on its node (torchrun's LOCAL_WORLD_SIZE), as cohort shares them.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    threads = a.threads or max(1, len(os.sched_getaffinity(0)) // local)
    cfg = {"data": a.data, "epochs": a.epochs, "max_train": a.max_train, "batch": a.batch,
           "warmup_steps": a.warmup_steps, "threads": threads, "lr": a.lr, "device": a.device,
           "like_fit_loop": a.like_fit_loop, "model": a.model, "compression": a.compression}
    if a.mode == "plain":
        plain(cfg)
    elif a.mode == "ddp":
        ddp(cfg)
    else:
        ray_main(cfg, a.workers, os.path.abspath(a.storage))


if __name__ == "__main__":
    sys.exit(main())
