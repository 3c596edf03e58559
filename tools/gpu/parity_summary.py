"""Count the verbose pytest logs of ``tools/gpu/test_suite.sh``'s shards: outcomes, failures, and the
collected tests no shard reported (written to unfinished.txt).

    python3 tools/gpu/parity_summary.py OUT_DIR SHARDS
"""

import argparse
import re

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("out", help="the directory holding shard<N>.log and nodes.txt")
ap.add_argument("shards", type=int, help="number of shards")
a = ap.parse_args()
out, shards = a.out, a.shards
outcome = re.compile(r"^(tests/\S+::.+?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)(?: |$)")
done, counts, failed = set(), {}, []
for s in range(shards):
    lines = open(f"{out}/shard{s}.log").read().splitlines()
    for line in lines:
        m = outcome.match(line)
        if m:
            node, what = m.groups()
            done.add(node)
            counts[what] = counts.get(what, 0) + 1
            if what in ("FAILED", "ERROR"):
                failed.append(node)
    print(f"shard {s}: {lines[-1] if lines else '(empty log)'}")
nodes = [line.strip() for line in open(f"{out}/nodes.txt") if line.strip()]
left = [n for n in nodes if n not in done]
with open(f"{out}/unfinished.txt", "w") as f:
    f.write("".join(n + "\n" for n in left))
print(counts, "unfinished:", len(left))
for n in failed:
    print("FAILED", n)
