#!/usr/bin/env python
"""Mutation testing of frontier's core modules, each against its own targeted tests.

    python tools/mutation.py                 # every core module
    python tools/mutation.py tree cache      # some of them
    python tools/mutation.py --list          # the modules, their tests and function filters

Each module runs in its own scratch copy (``build/mutation/<module>/``, git-ignored) with a
``[tool.mutmut]`` section that mutates that module only and selects its targeted tests, so a
mutant counts as killed only when the module's own tests catch it. mutmut (3.x, ``pip install
mutmut``) skips decorated functions (properties, pydantic validators, ``functools`` wrappers); in
the scratch copy, and only there, every such function's body is moved into a plain sibling
``<name>_plain`` that the decorated function calls, so mutmut mutates that logic too. The
repository's own source is never touched.

A survivor is accepted only when tools/mutation_equivalents.md lists it as equivalent: a
line containing its key ``module.function: <original line> -> <mutated line>`` (the key this
script prints) followed by the reason. The exit status is 1 when any survivor is not listed or
more than --max-survival percent of the reached mutants survive, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EQUIVALENTS = REPO / "tools" / "mutation_equivalents.md"

# module -> (targeted tests (pytest arguments), mutant-name globs within the module (None: every
# function)). The Triton backend's tests are left out: under the CPU interpreter they take minutes.
FAST = ["-k", "not triton"]
# request.py is reached by every drafting test: the per-backend contract sweeps and the ragged
# batch comparisons (seconds each under torch_ref) are left to the default run.
VALIDATION = ["-k", "not triton and not output_contract and not continues_from and not ragged_batch_equals"]
MODULES: dict[str, tuple[list[str], list[str] | None]] = {
    "tree": (["tests/test_tree.py"], None),
    "result": (["tests/test_result.py"], None),
    "config": (["tests/test_config.py"], None),
    "cache": (["tests/test_cache.py"], None),
    "registry": (["tests/test_registry.py"], None),
    "api": (["tests/test_api.py", *FAST], None),
    "request": (["tests/test_api.py", "tests/test_batch.py", *VALIDATION], None),
    "batch": (["tests/test_batch.py", *FAST], None),
    "drafter": (["tests/test_drafter.py", *FAST], None),
    # The loading package is mostly file reading; its validation (the JSON files, shard names, the
    # head's config.json: dimensions and RoPE settings, how problems are reported) is what is
    # mutated, against the unit tests of those helpers (the end-to-end loads take seconds each).
    "loading.files": (["tests/test_loading.py", "-k", "read_json or shard_names"],
                      ["x__read_json_file*", "x__shard_name*", "x__read_json__*"]),
    "loading.config_json": (["tests/test_loading.py", "-k", "rope_from or rope_parameters or head_dims or dims_"],
                            ["x__rope_from_config*", "x__dims_from_config*", "xǁHeadDimsǁ*"]),
    "loading.plan": (["tests/test_loading.py", "-k", "raise_problems or weight_of"],
                     ["x__raise_problems*", "x__weight_of*"]),
    # The head's fp8 side and its remembered results: quantizing, dequantizing, the scales' keys,
    # the value checks and the stamps that decide when a remembered check or derived copy is stale.
    "weights": (["tests/test_fp8_loading.py", "tests/test_hostile_inputs.py", "-k", "not triton"],
                ["x_tensor_state*", "x_tensors_stamp*", "x_stamp_matches*", "x_scale_key*", "x_scale_owner*",
                 "x__row_chunks*", "x_dequantize_fp8*", "x_quantize_fp8*", "x_fp8_nan*", "xǁDraftWeightsǁmemo*",
                 "xǁDraftWeightsǁdequantized*", "xǁDraftWeightsǁ_dequantize*", "xǁDraftWeightsǁquantized*",
                 "xǁDraftWeightsǁcheck_values*"]),
}

# ----------------------------------------------------------------------------------------------
# Scratch copy: decorated functions get a plain, mutable twin
# ----------------------------------------------------------------------------------------------
def undecorate(source: str) -> str:
    """Move the body of every decorated function (other than a lone @classmethod/@staticmethod,
    which mutmut handles) into an undecorated sibling ``<name>_plain`` and make the decorated
    function return ``<self|cls|Class>.<name>_plain(<its arguments>)``. Behaviour is unchanged."""
    import libcst as cst

    def lone_method_kind(decorators) -> str | None:
        names = [d.decorator.value for d in decorators if isinstance(d.decorator, cst.Name)]
        if "staticmethod" in names:
            return "staticmethod"
        if "classmethod" in names:
            return "classmethod"
        return None

    def needs_twin(fn: cst.FunctionDef) -> bool:
        if not fn.decorators:
            return False
        return not (
            len(fn.decorators) == 1
            and isinstance(fn.decorators[0].decorator, cst.Name)
            and fn.decorators[0].decorator.value in ("staticmethod", "classmethod")
        )

    def forward_args(params: cst.Parameters, skip_first: bool) -> list[cst.Arg]:
        args: list[cst.Arg] = []
        positional = list(params.posonly_params) + list(params.params)
        if skip_first:
            positional = positional[1:]
        args += [cst.Arg(p.name) for p in positional]
        if isinstance(params.star_arg, cst.Param):
            args.append(cst.Arg(params.star_arg.name, star="*"))
        args += [cst.Arg(p.name, keyword=p.name) for p in params.kwonly_params]
        if params.star_kwarg is not None:
            args.append(cst.Arg(params.star_kwarg.name, star="**"))
        return args

    def twin(fn: cst.FunctionDef, owner: str | None, taken: set[str]) -> tuple[cst.FunctionDef, cst.FunctionDef]:
        name = f"{fn.name.value}_plain"
        n = 2
        while name in taken:
            name, n = f"{fn.name.value}_plain{n}", n + 1
        taken.add(name)
        kind = lone_method_kind(fn.decorators) if owner else None
        all_params = list(fn.params.posonly_params) + list(fn.params.params)
        if owner is None or kind == "staticmethod":
            target = cst.Attribute(cst.Name(owner), cst.Name(name)) if owner else cst.Name(name)
            args = forward_args(fn.params, skip_first=False)
        else:
            target = cst.Attribute(all_params[0].name, cst.Name(name))
            args = forward_args(fn.params, skip_first=True)
        call = cst.Return(cst.Call(func=target, args=args))
        wrapper = fn.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine([call])]))
        plain_decorators = [cst.Decorator(cst.Name(kind))] if kind else []
        plain = fn.with_changes(name=cst.Name(name), decorators=plain_decorators, leading_lines=[cst.EmptyLine()])
        return wrapper, plain

    class Transformer(cst.CSTTransformer):
        def leave_ClassDef(self, original, updated):
            taken = {s.name.value for s in updated.body.body if isinstance(s, cst.FunctionDef)}
            body = []
            for stmt in updated.body.body:
                if isinstance(stmt, cst.FunctionDef) and needs_twin(stmt):
                    wrapper, plain = twin(stmt, updated.name.value, taken)
                    body += [wrapper, plain]
                else:
                    body.append(stmt)
            return updated.with_changes(body=updated.body.with_changes(body=body))

        def leave_Module(self, original, updated):
            taken = {s.name.value for s in updated.body if isinstance(s, cst.FunctionDef)}
            body = []
            for stmt in updated.body:
                if isinstance(stmt, cst.FunctionDef) and needs_twin(stmt):
                    wrapper, plain = twin(stmt, None, taken)
                    body += [wrapper, plain]
                else:
                    body.append(stmt)
            return updated.with_changes(body=body)

        def visit_FunctionDef(self, node):  # classes nested in functions are left alone
            return False

    return cst.parse_module(source).visit(Transformer()).code


def toml_value(value) -> str:
    return json.dumps(value)  # strings, numbers, booleans and lists of them: JSON spells them as TOML does


def write_config(pyproject: str, module: str, tests: list[str]) -> str:
    """The project's pyproject.toml with its [tool.mutmut] section narrowed to one module and
    its targeted tests (every other setting kept)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    settings = dict(tomllib.loads(pyproject).get("tool", {}).get("mutmut", {}))
    settings["source_paths"] = ["frontier"]
    settings["only_mutate"] = [f"frontier/{module.replace('.', '/')}.py"]
    settings["pytest_add_cli_args_test_selection"] = tests
    # Workers fork straight from mutmut's process (with one OpenMP thread, see run_module), except
    # for the registry: tests/conftest.py calls it at import time, which mutmut's forced-failure
    # check trips over unless the tests were loaded, unmutated, in a fork server. (The fork server
    # costs time elsewhere: some workers forked from it spin until the CPU limit kills them.)
    settings["process_isolation"] = "forkserver" if module == "registry" else "fork"
    kept = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", pyproject)
    body = "".join(f"{k} = {toml_value(v)}\n" for k, v in settings.items())
    return kept.rstrip("\n") + "\n\n[tool.mutmut]\n" + body


def prepare(module: str, tests: list[str], workdir: Path) -> None:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "frontier", workdir / "frontier", ignore=ignore)
    shutil.copytree(REPO / "tests", workdir / "tests", ignore=ignore)
    target = workdir / "frontier" / f"{module.replace('.', '/')}.py"
    target.write_text(undecorate(target.read_text()))
    (workdir / "pyproject.toml").write_text(write_config((REPO / "pyproject.toml").read_text(), module, tests))


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------
# Runs inside the work directory (mutmut's helpers read the config from the current directory).
COLLECT = r"""
import json, sys
from pathlib import Path
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
meta = json.loads(Path(sys.argv[1]).read_text())
out = {}
for name, code in meta["exit_code_by_key"].items():
    status = status_by_exit_code[code]
    diff = get_diff_for_mutant(name, path=Path(sys.argv[2])) if status not in ("killed", "no tests") else ""
    out[name] = [status, diff]
print(json.dumps(out))
"""


def mutant_key(module: str, name: str, diff: str) -> str:
    """``module.function: <original line> -> <mutated line>``, stable while the code it names is."""
    func = name.split(".")[-1].split("__mutmut_")[0]  # x_func, or xǁClassǁmethod
    func = func[2:].replace("ǁ", ".") if func.startswith("xǁ") else func[2:]
    func = re.sub(r"_plain\d*$", "", func)
    old = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    new = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return f"{module}.{func}: {' / '.join(old)} -> {' / '.join(new)}"


def matches(name: str, globs: list[str] | None) -> bool:
    import fnmatch

    return globs is None or any(fnmatch.fnmatch(name.split(".")[-1], g) for g in globs)


def run_module(module: str, workroot: Path, max_children: int, verbose: bool) -> dict:
    tests, globs = MODULES[module]
    workdir = workroot / module
    start = time.monotonic()
    prepare(module, tests, workdir)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # mutmut forks its workers from a process that has run torch code; a forked child can
    # deadlock in (and spin on) an inherited OpenMP pool. One thread per worker avoids the pool.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    cmd += [f"frontier.{module}.{g}" for g in globs or []]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=not verbose, text=True)
    meta = workdir / "mutants" / "frontier" / f"{module.replace('.', '/')}.py.meta"
    if not meta.exists():
        sys.stdout.write((proc.stdout or "") + (proc.stderr or ""))
        raise SystemExit(f"mutmut produced no results for {module} (exit {proc.returncode})")
    collected = subprocess.run(
        [sys.executable, "-c", COLLECT, str(meta), str(workdir / "mutants" / "frontier" / f"{module.replace('.', '/')}.py")],
        cwd=workdir, env=env, capture_output=True, text=True, check=True,
    )
    results = {k: v for k, v in json.loads(collected.stdout).items() if matches(k, globs)}
    return {"module": module, "results": results, "seconds": time.monotonic() - start}


def summarise(run: dict, equivalents: str) -> dict:
    module, results = run["module"], run["results"]
    counts = {"mutants": len(results), "killed": 0, "survived": 0, "equivalent": 0, "no tests": 0, "other": 0}
    unexplained, accepted = [], []
    for name, (status, diff) in sorted(results.items()):
        if status == "killed":
            counts["killed"] += 1
        elif status == "no tests":
            counts["no tests"] += 1
        elif status == "survived":
            key = mutant_key(module, name, diff)
            if key in equivalents:
                counts["equivalent"] += 1
                accepted.append(key)
            else:
                counts["survived"] += 1
                unexplained.append((name, key, diff))
        elif status == "not checked":
            raise SystemExit(f"{module}: mutant {name} was never run; see mutmut's output with --verbose")
        else:  # timeout, segfault, suspicious: the tests stopped the mutant
            counts["killed"] += 1
            counts["other"] += 1
    reached = counts["mutants"] - counts["no tests"]
    counts["survival %"] = 100.0 * (counts["survived"] + counts["equivalent"]) / reached if reached else 0.0
    return {"counts": counts, "unexplained": unexplained, "accepted": accepted, "seconds": run["seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help=f"modules to test (default: all of {', '.join(MODULES)})")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests, then exit")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "mutation")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--max-survival", type=float, default=5.0, help="percent of reached mutants (default 5)")
    parser.add_argument("--json", type=Path, help="also write the per-module summary here")
    parser.add_argument("-v", "--verbose", action="store_true", help="show mutmut's own output")
    args = parser.parse_args(argv)

    if args.list:
        for module, (tests, globs) in MODULES.items():
            print(f"{module:9} {' '.join(tests)}" + (f"  (functions: {' '.join(globs)})" if globs else ""))
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {list(MODULES)}")
    equivalents = EQUIVALENTS.read_text() if EQUIVALENTS.exists() else ""

    summaries = {}
    for module in args.modules or list(MODULES):
        print(f"== {module}: mutating frontier/{module.replace('.', '/')}.py against {' '.join(MODULES[module][0])}", flush=True)
        summaries[module] = summarise(run_module(module, args.workdir, args.max_children, args.verbose), equivalents)
        s = summaries[module]
        for name, key, diff in s["unexplained"]:
            print(f"  SURVIVED {name}\n    key: {key}")
            if args.verbose:
                print("    " + diff.replace("\n", "\n    "))
        print(f"  {s['counts']}  ({s['seconds']:.0f} s)", flush=True)

    print(f"\n{'module':9} {'mutants':>7} {'killed':>7} {'survived':>8} {'equiv':>6} {'no test':>7} {'surv%':>6} {'time':>6}")
    failed = False
    for module, s in summaries.items():
        c = s["counts"]
        print(
            f"{module:9} {c['mutants']:7} {c['killed']:7} {c['survived']:8} {c['equivalent']:6} {c['no tests']:7} "
            f"{c['survival %']:6.1f} {s['seconds']:5.0f}s"
        )
        failed |= bool(s["unexplained"]) or c["survival %"] > args.max_survival
    if args.json:
        args.json.write_text(json.dumps({m: {**s["counts"], "seconds": s["seconds"]} for m, s in summaries.items()}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
