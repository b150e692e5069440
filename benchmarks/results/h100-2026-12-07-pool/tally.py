"""Print the fresh commands' share at 99%, mean seconds to it, steps, and the command walls by kind."""

import json
import statistics
import sys

out = sys.argv[1]
runs = [json.loads(line) for line in open(f"{out}/summary.jsonl")]
walls = [json.loads(line) for line in open(f"{out}/walls.jsonl")]
new = [r for r in runs if r["tag"].startswith("new_")]
hits = [r["to99_s"] for r in new if r["to99_s"] is not None]
print(f"fresh commands: {len(hits)}/{len(new)} at 99%", end="")
if hits:
    print(f", mean {statistics.mean(hits):.4f} s (min {min(hits):.4f}, max {max(hits):.4f})", end="")
print(", steps", [r["steps"] for r in new])
for kind in ("new_", "old_", "fill_"):
    w = [r["wall_s"] for r in walls if r["tag"].startswith(kind)]
    if w:
        print(f"{kind} walls: mean {statistics.mean(w):.2f} s ({min(w):.2f}-{max(w):.2f}), n={len(w)}")
