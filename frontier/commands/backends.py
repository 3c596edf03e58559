"""``frontier backends``: every registered backend, whether it can run here, and its source."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backends", help="list backends, whether they are available and where they come from")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..registry import backend_report

    rows = backend_report()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    headers = ("backend", "available", "needs", "devices", "source")
    table = [
        (r["name"], "yes" if r["available"] else f"no: {r['why']}", r["needs"], r["devices"], r["source"]) for r in rows
    ]
    widths = [max(len(h), *(len(str(row[i])) for row in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    return 0
