"""PyTorch's side of the shard loader comparison: DataLoader(num_workers=k) over WebDataset tar
shards with the webdataset package, decoding each JPEG with Pillow into a uint8 tensor of
3 x H x W, batched by the DataLoader's default collate: what cohort's bench_shard_loader read does
with libjpeg-turbo on k threads.

    python shard_loader.py --shards DIR --workers K [--samples N] [--batch 64]

Prints one JSON line: samples_per_s (after the first 2 batches, as the cohort side), max_rss_mb
(the peak resident memory of the main process; each worker process holds its own).
"""
import argparse
import glob
import io
import json
import resource
import time

import numpy as np
import torch
import webdataset as wds
from PIL import Image


def to_tensor(sample):
    image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    array = np.asarray(image)
    return torch.from_numpy(array.copy()).permute(2, 0, 1), int(sample["cls"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shards", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--samples", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    urls = sorted(glob.glob(a.shards + "/images-*.tar"))
    # Shards in order, no shuffling (as the cohort side is run), split over the workers.
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(to_tensor)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, num_workers=a.workers, persistent_workers=False)
    samples = timed = batches = 0
    checksum = 0
    t0 = time.perf_counter()
    for images, labels in loader:
        checksum += int(labels.sum())
        samples += len(labels)
        batches += 1
        if batches == 2:
            t0 = time.perf_counter()
            timed = samples
        if a.samples and samples >= a.samples:
            break
    seconds = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"loader": "torch", "workers": a.workers, "samples": samples,
                      "samples_per_s": (samples - timed) / seconds, "max_rss_mb": rss_mb, "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
