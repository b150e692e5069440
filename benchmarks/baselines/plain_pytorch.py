r"""Plain PyTorch MNIST training (no Accelerate, no DeepSpeed): the reference for overhead.

    python -m benchmarks.baselines.plain_pytorch --model cnn --batch-size 512 --epochs 1 --data device
    python -m benchmarks.baselines.plain_pytorch --config recipes/fast99_graph.yaml --precision bf16

Two data paths:
  --data dataloader  torch DataLoader over accel_mnist's ImageTensorDataset (per-sample
                     __getitem__ + collate), batches copied to the device each step;
  --data device      the whole split on the device as uint8; each step gathers a batch of
                     rows (images[idx]) from a per-epoch torch.randperm and normalises it there.
Same models (accel_mnist.models), same normalisation, Adam by default, optional autocast
(--precision fp16 with a GradScaler, or bf16). Reports samples/s, ms/step (timed steps
exclude --warmup-steps), train seconds and test accuracy; writes benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from accel_mnist.data.catalog import DATASETS, ImageTensorDataset, load_split
from accel_mnist.models import build_model, num_parameters
from benchmarks import benchlib


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="plain PyTorch MNIST baseline")
    p.add_argument("--model", default="cnn")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--data", choices=["dataloader", "device"], default="device")
    p.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=False,
                   help="torch.backends.cudnn.benchmark = True")  # fmt: skip
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=False,
                   help="the model (and so its convolutions) in channels-last memory format")  # fmt: skip
    p.add_argument("--cycle-momentum", action=argparse.BooleanOptionalAction, default=True,
                   help="onecycle: also cycle Adam's beta1, as torch's OneCycleLR does by default")  # fmt: skip
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=False,
                   help="capture forward, backward and Adam's step once as a CUDA graph (torch.cuda.graphs' "
                   "whole-network recipe) and replay it for every full batch")  # fmt: skip
    p.add_argument("--precision", choices=["no", "fp16", "bf16"], default="no", help="autocast dtype")
    p.add_argument("--warmup-steps", type=int, default=5, help="steps left out of ms/step")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="also save the whole record as OUT/<bench>-<stamp>-<tag>.json")
    p.add_argument("--scheduler", choices=["none", "onecycle"], default="none", help="torch OneCycleLR over the run")
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (clock paused)")
    p.add_argument("--stop-at-accuracy", type=float, default=None, help="stop at the first evaluation >= this")
    p.add_argument("--metrics-out", default=None, help="JSON lines of step, train_seconds, test_accuracy per "
                   "evaluation (accel_mnist's metrics.jsonl keys)")  # fmt: skip
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=False,
                   help="one untimed forward/backward on a copy of the model before the clock starts")  # fmt: skip
    p.add_argument("--config", default=None, help="an accel_mnist recipe (YAML): the keys of RECIPE_KEYS become "
                   "the defaults; other keys are listed as ignored")  # fmt: skip
    args = p.parse_args(argv)
    ignored: list[str] = []
    if args.config:
        defaults, ignored = recipe_defaults(args.config)
        p.set_defaults(**defaults)
        args = p.parse_args(argv)  # flags given on the command line still win
    args.recipe_ignored = ignored
    return args


RECIPE_KEYS = ("model", "batch_size", "lr", "epochs", "max_steps", "scheduler", "eval_every", "stop_at_accuracy",
               "seed", "prewarm", "cudnn_benchmark", "channels_last", "cuda_graph", "cycle_momentum")  # fmt: skip


def recipe_defaults(path: str) -> tuple[dict, list[str]]:
    """The keys of an accel_mnist recipe this loop can follow (as argparse defaults), and the rest."""
    import yaml

    recipe = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(recipe, dict):
        raise SystemExit(f"error: {path}: expected a mapping of training-config keys")
    # accel_mnist's `prewarm` is this loop's --warmup.
    known = {("warmup" if k == "prewarm" else k): v for k, v in recipe.items() if k in RECIPE_KEYS}
    return known, sorted(k for k in recipe if k not in RECIPE_KEYS)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceBatches:
    """The whole split on the device; batches by a fresh randperm each epoch (plain, inline)."""

    def __init__(self, images, labels, mean, std, batch_size, device, shuffle, seed):
        self.images, self.labels = images.to(device), labels.to(device)
        self.mean, self.std, self.batch_size, self.device = mean, std, batch_size, device
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def __len__(self):
        return -(-len(self.labels) // self.batch_size)

    def __iter__(self):
        n = len(self.labels)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(n)
        self.epoch += 1
        for idx in order.to(self.device).split(self.batch_size):
            yield self.normalise(self.images[idx]), self.labels[idx]

    def normalise(self, images):
        return images.to(torch.float32).div_(255.0).sub_(self.mean).div_(self.std).unsqueeze(1)


def build_loaders(args, device):
    spec = DATASETS["mnist"]
    data_dir = args.data_dir or benchlib.data_dir()
    train = load_split("mnist", data_dir, train=True, download=False)
    test = load_split("mnist", data_dir, train=False, download=False)
    if args.data == "device":
        return (DeviceBatches(*train, spec.mean, spec.std, args.batch_size, device, True, args.seed),
                DeviceBatches(*test, spec.mean, spec.std, 1000, device, False, 0))  # fmt: skip
    pin = device.type == "cuda"
    return (torch.utils.data.DataLoader(ImageTensorDataset(*train, spec.mean, spec.std), batch_size=args.batch_size,
                                        shuffle=True, generator=torch.Generator().manual_seed(args.seed),
                                        pin_memory=pin),
            torch.utils.data.DataLoader(ImageTensorDataset(*test, spec.mean, spec.std), batch_size=1000,
                                        pin_memory=pin))  # fmt: skip


@torch.no_grad()
def evaluate(model, loader, device, autocast) -> float:
    model.eval()
    correct = total = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            logits = model(x)
        correct += int((logits.argmax(1) == y).sum())
        total += len(y)
    model.train()
    return correct / total


def capture(model, optimizer, static_x, static_y, autocast):
    """torch.cuda.graphs' whole-network capture: warm-up iterations on a side stream, then one
    recorded step. The warm-up's updates are undone (weights, buffers, Adam's state), as
    accel_mnist does, so that both loops train from the same start."""
    import copy

    def work():
        with autocast():
            loss = F.cross_entropy(model(static_x).float(), static_y)
        loss.backward()
        optimizer.step()
        return loss

    saved = copy.deepcopy(model.state_dict())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            work()
    torch.cuda.current_stream().wait_stream(side)
    model.load_state_dict(saved)  # copies in place: the graph's tensors stay where they are
    with torch.no_grad():
        for state in optimizer.state.values():
            for value in state.values():
                value.zero_()  # a fresh Adam's state: step 0, zero moments
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = work()
    return graph, loss


def run(args) -> dict:
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.precision == "fp16" and device.type == "cpu":
        raise SystemExit("error: --precision fp16 needs a GPU (use no or bf16 on CPU)")
    train_loader, test_loader = build_loaders(args, device)
    model = build_model(args.model).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    graphed = args.cuda_graph and device.type == "cuda" and args.precision != "fp16"
    if graphed and args.scheduler == "onecycle" and args.cycle_momentum:
        # OneCycleLR sets Adam's betas anew each step; a graph would keep the first beta1.
        raise SystemExit("error: --cuda-graph with onecycle needs --no-cycle-momentum")
    # Capture wants Adam's capturable mode and the learning rate as a device tensor (the schedule fills it).
    lr = torch.tensor(args.lr, device=device) if graphed else args.lr
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, capturable=graphed)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)

    def autocast():
        # Autocast's weight cache must be off inside a graph (torch.cuda.graphs docs).
        return torch.autocast(device.type, dtype=dtype, cache_enabled=not graphed) if dtype else nullcontext()

    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    total_steps = len(train_loader) * args.epochs
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    warmup = min(args.warmup_steps, max(total_steps - 1, 0))
    scheduler = None
    if args.scheduler == "onecycle":
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=args.lr, total_steps=max(total_steps, 1), cycle_momentum=args.cycle_momentum
        )
    curve: list[dict] = []
    paused = 0.0  # seconds of evaluation inside the run, left out of train_seconds

    def checkpoint_eval(epoch_end: bool) -> bool:
        """Evaluate with the clock stopped; True when the target accuracy is reached."""
        nonlocal paused
        sync(device)
        tick = time.perf_counter()
        accuracy = evaluate(model, test_loader, device, autocast)
        row = {"step": step, "epoch": round(step / len(train_loader), 4), "test_accuracy": accuracy,
               "train_seconds": tick - start - paused, "epoch_end": epoch_end}  # fmt: skip
        curve.append(row)
        paused += time.perf_counter() - tick
        return args.stop_at_accuracy is not None and accuracy >= args.stop_at_accuracy

    model.train()
    if args.warmup:
        # As accel_mnist's `prewarm: true`: an untimed forward and backward on a copy, in the run's
        # precision, of a batch drawn from the loader (its assembly's kernels load here too; the
        # draw moves the loader on by one epoch) and of the epoch's last, smaller shape (kernel
        # loading and cuDNN's choices leave the clock; the trained weights are untouched).
        import copy

        spare = copy.deepcopy(model)
        x, y = next(iter(train_loader))
        samples = len(train_loader.labels) if isinstance(train_loader, DeviceBatches) else len(train_loader.dataset)
        for size in sorted({args.batch_size, samples % args.batch_size} - {0}, reverse=True):
            with autocast():
                loss = F.cross_entropy(spare(x[:size].to(device)).float(), y[:size].to(device))
            loss.backward()
        del spare
        sync(device)
    capture_seconds = 0.0
    if graphed:
        tick = time.perf_counter()
        static_x = torch.zeros(args.batch_size, 1, 28, 28, device=device)
        static_y = torch.zeros(args.batch_size, dtype=torch.long, device=device)
        graph, static_loss = capture(model, optimizer, static_x, static_y, autocast)
        sync(device)
        capture_seconds = time.perf_counter() - tick
    step = 0
    samples_timed = 0
    sync(device)
    start = time.perf_counter()
    timed_start = start
    while step < total_steps:
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if graphed and len(y) == args.batch_size:
                static_x.copy_(x)
                static_y.copy_(y)
                graph.replay()
                loss = static_loss
            else:  # the eager step (and, when graphed, the epoch's last smaller batch)
                with autocast():
                    loss = F.cross_entropy(model(x).float(), y)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            if scheduler is not None:
                scheduler.step()
            step += 1
            if step == warmup:
                sync(device)
                timed_start = time.perf_counter()
            elif step > warmup:
                samples_timed += len(y)
            if args.eval_every and step % args.eval_every == 0 and step < total_steps and checkpoint_eval(False):
                total_steps = step
            if step >= total_steps:
                break
        already = bool(curve) and curve[-1]["step"] == step
        if (args.eval_every or args.metrics_out) and not already and checkpoint_eval(True):
            total_steps = step
    sync(device)
    end = time.perf_counter()
    timed_steps = step - warmup
    elapsed = end - timed_start - paused
    if args.metrics_out:
        Path(args.metrics_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.metrics_out).write_text("".join(json.dumps(row) + "\n" for row in curve))
    result = {
        "steps": step,
        "timed_steps": timed_steps,
        "train_seconds": end - start - paused,
        "curve": curve,
        "ms_per_step": elapsed / max(timed_steps, 1) * 1e3,
        "samples_per_second": samples_timed / elapsed if elapsed > 0 else float("nan"),
        "final_loss": loss.item(),
        "num_parameters": num_parameters(model),
        "device": device.type,
        "cuda_graph": graphed,
        "capture_seconds": capture_seconds,
    }
    if not args.no_eval:
        result["test_accuracy"] = evaluate(model, test_loader, device, autocast)
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    if args.config:
        print(f"plain_pytorch: from {args.config}, ignored keys: {', '.join(args.recipe_ignored) or 'none'}")
    record = {"benchmark": "plain_pytorch", "config": config, **result}
    tag = f"{args.model}-{args.data}-b{args.batch_size}-{args.precision}-{result['device']}"
    benchlib.save_record("plain_pytorch", tag, record, args.out)
    print(
        f"plain_pytorch {tag}: {result['samples_per_second']:.0f} samples/s, {result['ms_per_step']:.3f} ms/step, "
        f"train {result['train_seconds']:.2f} s, test_accuracy {result.get('test_accuracy', float('nan')):.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
