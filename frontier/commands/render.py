"""Draw a Frontier as an indented tree in the terminal."""

from __future__ import annotations

from typing import Callable, Optional

from ..result import Frontier


def render_tree(fr: Frontier, token_text: Optional[Callable[[int], str]] = None) -> str:
    """One line per node: token id (and text), depth, cumulative log-prob where known."""
    tokens = fr.draft_tokens[0].tolist()
    depth = fr.tree_position_ids.tolist()
    mask = fr.tree_mask[0, 0].bool()
    t = len(tokens)
    parent = [-1] * t
    for i in range(1, t):
        anc = [j for j in range(i) if bool(mask[i, j]) and depth[j] == depth[i] - 1]
        parent[i] = anc[0]
    children: list[list[int]] = [[] for _ in range(t)]
    for i in range(1, t):
        children[parent[i]].append(i)
    scores = fr.scores.tolist() if fr.scores is not None else None

    def label(i: int) -> str:
        text = f"{tokens[i]}"
        if token_text is not None:
            text += f" {token_text(tokens[i])!r}"
        extra = f"depth {depth[i]}"
        if scores is not None and i > 0:
            extra += f", score {scores[i]:.3f}"
        return f"[{i}] {text}  ({extra})"

    lines = [f"[0] {tokens[0]}  (root)"]

    def walk(node: int, prefix: str) -> None:
        kids = children[node]
        for n, c in enumerate(kids):
            last = n == len(kids) - 1
            lines.append(prefix + ("└── " if last else "├── ") + label(c))
            walk(c, prefix + ("    " if last else "│   "))

    walk(0, "")
    return "\n".join(lines)
