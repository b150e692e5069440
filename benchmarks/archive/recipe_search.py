"""Plain-PyTorch search for a <=0.5 s time-to-99% MNIST recipe on one GPU (5 seeds each).

`ACCEL_MNIST_DATA_DIR=... python -m benchmarks.recipe_search [ROW ...]` on a GPU machine: the
whole split on the GPU, each candidate trained for 5 seeds in one process after one warm-up
run, evaluated every 10 steps with the clock paused, stopped at 99% test accuracy. Writes
`$OUT/recipes.json` (or ./recipes.json). Its 2026-12-01 H200 output chose recipes/fast99.yaml.
"""

import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

D = os.environ["ACCEL_MNIST_DATA_DIR"]


def idx(name):
    b = gzip.open(f"{D}/{name}").read()
    nd = b[3]
    dims = np.frombuffer(b, ">u4", nd, 4)
    return np.frombuffer(b, np.uint8, offset=4 + 4 * nd).reshape(dims)


dev = "cuda"
Xtr = torch.tensor(idx("train-images-idx3-ubyte.gz")).to(dev)
Ytr = torch.tensor(idx("train-labels-idx1-ubyte.gz")).long().to(dev)
Xte = torch.tensor(idx("t10k-images-idx3-ubyte.gz")).to(dev)
Yte = torch.tensor(idx("t10k-labels-idx1-ubyte.gz")).long().to(dev)
mean, std = 0.1307, 0.3081


def norm(x):
    return ((x.float() / 255 - mean) / std).unsqueeze(1)


Xtr_f, Xte_f = norm(Xtr), norm(Xte)


def block(i, o):
    return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True), nn.MaxPool2d(2)]


def bn3(c=(32, 64, 128)):
    return nn.Sequential(*block(1, c[0]), *block(c[0], c[1]), *block(c[1], c[2]), nn.Flatten(), nn.Linear(c[2] * 9, 10))


def bn3gap(c=(32, 64, 128)):
    return nn.Sequential(
        *block(1, c[0]),
        *block(c[0], c[1]),
        *block(c[1], c[2]),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(c[2], 10),
    )


def tuomaso():
    return nn.Sequential(
        nn.Conv2d(1, 24, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(24, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(512, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


MODELS = {
    "bn3": bn3,
    "bn3s": lambda: bn3((24, 48, 96)),
    "bn3gap": bn3gap,
    "bn3w": lambda: bn3((32, 64, 256)),
    "tuomaso": tuomaso,
}


@torch.no_grad()
def acc(m, amp):
    m.eval()
    with torch.autocast("cuda", torch.bfloat16, enabled=amp):
        p = torch.cat([m(Xte_f[i : i + 5000]).argmax(1) for i in range(0, 10000, 5000)])
    m.train()
    return (p == Yte).float().mean().item()


def run(r, seed):
    torch.manual_seed(seed)
    m = MODELS[r["model"]]().to(dev)
    if r.get("cl"):
        m = m.to(memory_format=torch.channels_last)
    bs, ep = r["bs"], r["epochs"]
    steps_per = 60000 // bs
    total = int(steps_per * ep)
    opt = torch.optim.Adam(m.parameters(), lr=r["lr"], betas=r.get("betas", (0.9, 0.999)), foreach=True)
    sch = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=r["lr"], total_steps=total, pct_start=r.get("pct", 0.25))
    amp = r.get("amp", False)
    ls = r.get("ls", 0.0)
    every = r.get("every", 10)
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    clock = 0.0
    step = 0
    torch.cuda.synchronize()
    t = time.perf_counter()
    reached = None
    a = 0.0
    while step < total:
        perm = torch.randperm(60000, device=dev, generator=g)
        for i in range(steps_per):
            if step >= total:
                break
            idx_ = perm[i * bs : (i + 1) * bs]
            x = Xtr_f.index_select(0, idx_)
            y = Ytr.index_select(0, idx_)
            with torch.autocast("cuda", torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(m(x).float(), y, label_smoothing=ls)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sch.step()
            step += 1
            if step % every == 0 or step == total:
                if step >= r.get("first_eval", 0) or step == total:
                    torch.cuda.synchronize()
                    clock += time.perf_counter() - t
                    a = acc(m, amp)
                    if a >= 0.99 and reached is None:
                        reached = (step, clock, a)
                        return reached
                    torch.cuda.synchronize()
                    t = time.perf_counter()
    return (step, clock, a) if reached is None else reached


RECIPES = [
    {"model": "bn3", "bs": 512, "lr": 1e-2, "epochs": 1.5},
    {"model": "bn3", "bs": 512, "lr": 1e-2, "epochs": 2},
    {"model": "bn3", "bs": 512, "lr": 1e-2, "epochs": 1.5, "amp": True, "cl": True},
    {"model": "bn3", "bs": 1024, "lr": 2e-2, "epochs": 2},
    {"model": "bn3", "bs": 512, "lr": 1e-2, "epochs": 1.5, "ls": 0.1},
    {"model": "bn3", "bs": 512, "lr": 2e-2, "epochs": 1.5, "betas": (0.7, 0.9)},
    {"model": "bn3", "bs": 256, "lr": 1e-2, "epochs": 1.0, "betas": (0.7, 0.9)},
    {"model": "bn3s", "bs": 512, "lr": 1e-2, "epochs": 1.5},
    {"model": "bn3gap", "bs": 512, "lr": 1e-2, "epochs": 1.5},
    {"model": "bn3w", "bs": 512, "lr": 1e-2, "epochs": 1.5},
    {"model": "tuomaso", "bs": 256, "lr": 1e-2, "epochs": 1.3, "betas": (0.7, 0.9)},
    {"model": "bn3", "bs": 768, "lr": 1.5e-2, "epochs": 1.5, "betas": (0.8, 0.95)},
]
if __name__ == "__main__":
    which = [RECIPES[int(i)] for i in sys.argv[1:]] if len(sys.argv) > 1 else RECIPES
    t0 = time.perf_counter()
    first = run(RECIPES[0], 100)
    print("first-in-process", first, "setup+first", time.perf_counter() - t0, flush=True)
    out = []
    for r in which:
        rs = [run(r, s) for s in range(5)]
        row = {
            **r,
            "acc": [x[2] for x in rs],
            "secs": [round(x[1], 3) for x in rs],
            "steps": [x[0] for x in rs],
            "mean_acc": float(np.mean([x[2] for x in rs])),
            "mean_secs": float(np.mean([x[1] for x in rs])),
            "all_reached": all(x[2] >= 0.99 for x in rs),
        }
        print(json.dumps(row), flush=True)
        out.append(row)
    json.dump(out, open(os.environ.get("OUT", ".") + "/recipes.json", "w"), indent=1)
