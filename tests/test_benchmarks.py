"""The maintained tools under benchmarks/ and tools/ still start (CPU only, no GPU work): every
Python tool answers --help, every shell script parses, and none reaches into the triton backend's
internals (its tuning knobs or private launch functions)."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PY_TOOLS = sorted(p.relative_to(REPO).as_posix() for d in ("benchmarks", "tools") for p in (REPO / d).rglob("*.py"))
SH_TOOLS = sorted(p.relative_to(REPO).as_posix() for d in ("benchmarks", "tools") for p in (REPO / d).rglob("*.sh"))


def test_the_tools_are_found():
    assert {"benchmarks/host_overhead.py", "benchmarks/bf16_match.py", "benchmarks/generate.py",
            "tools/mutation.py", "tools/gpu/parity_summary.py"} <= set(PY_TOOLS)
    assert {"benchmarks/ab.sh", "tools/gpu/env.sh", "tools/gpu/test_suite.sh"} <= set(SH_TOOLS)
    assert not (REPO / "scripts").exists()


@pytest.mark.parametrize("tool", PY_TOOLS)
def test_python_tool_answers_help(tool, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [tool, "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / tool), run_name="__main__")
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("tool", SH_TOOLS)
def test_shell_tool_parses(tool):
    proc = subprocess.run(["bash", "-n", str(REPO / tool)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_tools_reference_only_existing_paths():
    """Paths of tools that the tools and their guide name exist (a moved tool leaves no dangling name)."""
    import re

    pattern = re.compile(r"\b((?:benchmarks|tools)/[\w/.-]+\.(?:py|sh|md))")
    for f in PY_TOOLS + SH_TOOLS + ["benchmarks/README.md", "tools/mutation_equivalents.md"]:
        for path in pattern.findall((REPO / f).read_text()):
            assert (REPO / path).exists(), f"{f} names {path}, which does not exist"


@pytest.mark.parametrize("tool", [t for t in PY_TOOLS + SH_TOOLS if t.startswith("benchmarks/")])
def test_benchmarks_use_the_public_surface(tool):
    """Maintained timing tools pass at most the triton option mode; no Tuning, no backend internals."""
    text = (REPO / tool).read_text()
    for word in ("Tuning", "frontier.backends", "tuning=", "_launch"):
        assert word not in text, f"{tool} uses {word}"


def test_mutation_tool_lists_its_modules(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["tools/mutation.py", "--list"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "tools" / "mutation.py"), run_name="__main__")
    assert exc.value.code == 0
    listed = capsys.readouterr().out.split()
    assert "tree" in listed
    for word in listed:
        if word.startswith("tests/"):
            assert (REPO / word.split("::")[0]).exists(), word
    assert (REPO / "tools" / "mutation_equivalents.md").exists()
