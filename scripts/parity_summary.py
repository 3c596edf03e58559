"""Count the verbose pytest logs of ``scripts/gpu_parity.sh``'s shards: outcomes, failures, and the
collected tests no shard reported (written to unfinished.txt)."""

import re
import sys

out, shards = sys.argv[1], int(sys.argv[2])
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
