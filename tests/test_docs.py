"""The documentation's examples run: every fenced ```python block of README.md and docs/*.md.

The blocks of one file run in order in one namespace (a later block may use an earlier block's
names), in a scratch working directory, on the CPU. A block is left out only by an explicit
marker on the line before its fence, ``<!-- skip-test: why -->``; each such block is reported as
a skipped test carrying that reason (the run's -ra summary lists them).

Cheap CLI lines of ```bash blocks (``frontier demo``, ``frontier backends``, ``frontier
--version``, ``frontier generate --random-tiny ...``) run too, through ``python -m frontier.cli``;
nothing else in a bash block runs (no installs).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SKIP = re.compile(r"^\s*<!--\s*skip-test:\s*(.+?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```+\s*([A-Za-z0-9_+-]*)")
# CLI commands cheap enough to run here (a prefix of the words after "frontier").
CHEAP_CLI = (("demo",), ("backends",), ("--version",), ("generate", "--random-tiny"))


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str  # the skip marker's reason, "" when the block runs

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, with the skip marker of the line before each."""
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2).lower()
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.match(prev)
        body = []
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```+\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        out.append(Block(path, i + 1, lang, "\n".join(body) + "\n", skip.group(1) if skip else ""))
        i = j + 1
    return out


ALL = [b for f in FILES for b in blocks(f)]
SKIPPED = [b for b in ALL if b.lang in ("python", "bash", "sh") and b.skip]


def _ids(p: Path) -> str:
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("path", FILES, ids=_ids)
def test_python_blocks_run(path, tmp_path, monkeypatch, one_thread):
    """Every python block of the file runs, in order, in one namespace."""
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__docs__"}
    for b in blocks(path):
        if b.lang != "python" or b.skip:
            continue
        try:
            exec(compile(b.code, b.where, "exec"), ns)
        except Exception as e:  # name the block, keep the traceback
            raise AssertionError(f"python block at {b.where} failed: {type(e).__name__}: {e}") from e


def cheap_commands(code: str) -> list[list[str]]:
    """The cheap ``frontier ...`` commands of a bash block (continuation lines joined; ``&&``
    chains split), as argument lists after ``frontier``."""
    text = re.sub(r"\\\n", " ", code)
    cmds = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        for part in line.split("&&"):
            words = shlex.split(part.strip())
            if len(words) >= 2 and words[0] == "frontier":
                args = words[1:]
                if any(tuple(args[: len(p)]) == p for p in CHEAP_CLI):
                    cmds.append(args)
    return cmds


SHELL = [b for b in ALL if b.lang in ("bash", "sh", "console", "") and not b.skip and cheap_commands(b.code)]


@pytest.mark.parametrize("block", SHELL, ids=[b.where for b in SHELL])
def test_cheap_cli_lines_run(block, tmp_path):
    for args in cheap_commands(block.code):
        r = subprocess.run([sys.executable, "-m", "frontier.cli", *args], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"{block.where}: frontier {' '.join(args)} exited {r.returncode}\n{r.stderr[-2000:]}"


@pytest.mark.parametrize("block", SKIPPED, ids=[b.where for b in SKIPPED])
def test_skipped_blocks_are_listed(block):
    """Each opted-out block shows in the run's summary with the reason its marker gives."""
    pytest.skip(f"docs block {block.where} not run: {block.skip}")


def test_docs_have_python_blocks():
    """The collector sees the examples (a broken fence pattern would silently run nothing)."""
    py = [b for b in ALL if b.lang == "python"]
    assert len([b for b in py if b.path.name == "README.md" and not b.skip]) >= 3
    assert all(b.code.strip() for b in py), [b.where for b in py if not b.code.strip()]
    print(f"{len(py)} python blocks, {len([b for b in py if b.skip])} skipped by marker")
