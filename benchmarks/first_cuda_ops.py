"""Where the seconds of a fresh process's first GPU work go (what `prewarm` pays), op by op:

    python -m benchmarks.first_cuda_ops [--model bncnn] [--batch-size 512]

Each stage runs once, for the first time in the process, with the device synchronised after
it; prints one JSON line of seconds per stage. A stage's time is what its first call costs
beyond the stages before it: CUDA context, cuBLAS and cuDNN set-up, kernel loading.
`--overlap` imports torch._dynamo (which building the first torch optimizer imports) on a
background thread from the start, to see how much of it the CUDA stages can hide.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bncnn")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--overlap", action="store_true", help="import torch._dynamo on a thread meanwhile")
    args = p.parse_args(argv)
    seconds: dict[str, float] = {}

    def stage(name: str, fn: Callable[[], object]) -> object:
        tick = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds[name] = round(time.perf_counter() - tick, 4)
        return out

    tick = time.perf_counter()
    import torch
    import torch.nn.functional as F

    seconds["import_torch"] = round(time.perf_counter() - tick, 4)
    start = time.perf_counter()
    if args.overlap:
        import threading

        importer = threading.Thread(target=lambda: __import__("torch._dynamo"), daemon=True)
        importer.start()
    from accel_mnist.models import build_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    stage("cuda_context", lambda: torch.zeros(1, device=device))
    model = stage("model_to_device", lambda: build_model(args.model).to(device).train())
    x = torch.zeros(args.batch_size, 1, 28, 28, device=device)
    y = torch.zeros(args.batch_size, dtype=torch.long, device=device)
    logits = stage("forward", lambda: model(x))
    loss = stage("loss", lambda: F.cross_entropy(logits.float(), y))
    stage("backward", lambda: loss.backward())
    if args.overlap:
        stage("join_dynamo_import", importer.join)
    optimizer = stage("adam_build", lambda: torch.optim.Adam(model.parameters(), lr=1e-3))
    stage("adam_step", lambda: optimizer.step())
    stage("forward_again", lambda: model(x).sum().item())
    model.eval()
    with torch.no_grad():
        stage("eval_5000", lambda: model(torch.zeros(5000, 1, 28, 28, device=device)).sum().item())
    seconds["after_import_torch"] = round(time.perf_counter() - start, 4)
    print(json.dumps({"device": device.type, "model": args.model, "batch_size": args.batch_size,
                      "overlap": args.overlap, **seconds}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
