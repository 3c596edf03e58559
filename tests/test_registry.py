"""The backend registry: registration rules, lookup errors, and real entry-point plugin discovery.

Plugins here are real installed-looking distributions: a temporary ``*.dist-info`` directory with
``METADATA`` and ``entry_points.txt`` next to a plugin module, put on ``sys.path`` so that
``importlib.metadata`` finds them exactly as it finds a pip-installed package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import frontier
from frontier import (
    Backend,
    BackendNotFoundError,
    BackendUnavailableError,
    FrontierConfig,
    FrontierError,
    RegistryError,
    available_backends,
    frontier_generate,
    get_backend,
    register_backend,
    unregister_backend,
)
from frontier import registry
from frontier.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
BUILTINS = sorted(registry._BUILTINS)  # stub, torch_ref, triton (and any built-in added later)
assert {"stub", "torch_ref", "triton"} <= set(BUILTINS)


@pytest.fixture(autouse=True)
def restore_registry(monkeypatch):
    """Every test leaves the registry (and sys.modules) as it found it."""
    monkeypatch.delenv(registry.AUTOLOAD_ENV, raising=False)
    saved_entries = dict(registry._entries)
    saved_scanned = registry._plugins_scanned
    saved_modules = set(sys.modules)
    registry._reset_plugin_scan()
    yield
    with registry._lock:
        registry._entries.clear()
        registry._entries.update(saved_entries)
        registry._plugins_scanned = saved_scanned
    for name in set(sys.modules) - saved_modules:
        if name.startswith("frontier_test_plugin"):
            del sys.modules[name]


# A working third-party backend: a breadth-first K-ary tree over the last context tokens, packed
# with the shared tree code. It imports frontier itself, as a real plugin would.
GOOD_PLUGIN = '''
import torch
from frontier import Backend, Frontier
from frontier.tree import pack_tree

IMPORTED = True

class BreadthFirstBackend(Backend):
    requires_weights = False
    devices = ("cpu",)
    dtypes = (torch.float32,)
    description = "test plugin: breadth-first tree"

    def generate(self, request):
        cfg = request.cfg
        t, k = cfg.total_token, cfg.top_k
        node = torch.arange(1, t)
        parent_pos = (node - 1) // k  # [T-1] breadth-first, K children per node
        packed = pack_tree(parent_pos, sampling=request.sampling, padded=request.padded, max_depth=cfg.depth + 1)
        root = request.input_ids[0, -1:] if request.input_ids is not None else torch.zeros(1, dtype=torch.long)
        tokens = torch.cat([root, (root + node) % cfg.vocab_size])[None]
        return Frontier(
            draft_tokens=tokens,
            retrieve_indices=packed.retrieve_indices,
            tree_mask=packed.tree_mask,
            tree_position_ids=packed.tree_position_ids,
            leaf_count=packed.leaf_count,
            padded=request.padded,
        )
'''

BROKEN_PLUGIN = '''
raise ImportError("frontier_test_plugin_broken needs libfoo.so, which is not installed")
'''


def install_plugin(root: Path, dist: str, module: str, source: str, entry_points: dict[str, str]) -> None:
    """Write ``module.py`` and ``<dist>-0.1.dist-info`` (METADATA + entry_points.txt) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[frontier.backends]\n{lines}\n")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Two installed plugin distributions on sys.path: a working one and one whose import fails."""
    install_plugin(
        tmp_path / "site",
        "frontier-test-plugin-good",
        "frontier_test_plugin_good",
        GOOD_PLUGIN,
        {"breadth": "frontier_test_plugin_good:BreadthFirstBackend",
         "stub": "frontier_test_plugin_good:BreadthFirstBackend"},  # tries to shadow a built-in
    )
    install_plugin(
        tmp_path / "site",
        "frontier-test-plugin-broken",
        "frontier_test_plugin_broken",
        BROKEN_PLUGIN,
        {"broken": "frontier_test_plugin_broken:Backend"},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry._reset_plugin_scan()
    return tmp_path / "site"


CFG = FrontierConfig(total_token=20, depth=3, top_k=3, vocab_size=100, hidden_size=8)


def feats(cfg: FrontierConfig = CFG, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(1, 5, cfg.feature_size, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Entry-point discovery
# ----------------------------------------------------------------------------------------------
def test_plugins_are_discovered_without_being_imported(plugins):
    names = available_backends()
    assert "breadth" in names and "broken" in names
    assert set(BUILTINS) <= set(names)
    assert "frontier_test_plugin_good" not in sys.modules
    assert "frontier_test_plugin_broken" not in sys.modules


def test_discovered_plugin_runs_through_frontier_generate(plugins):
    backend = get_backend("breadth")
    assert sys.modules["frontier_test_plugin_good"].IMPORTED
    assert type(backend).__name__ == "BreadthFirstBackend" and backend.name == "breadth"
    assert get_backend("breadth") is backend  # resolved once
    ids = torch.tensor([[5, 6, 7, 8, 9, 42]])
    for sampling in (False, True):
        for padded in (False, True):
            fr = frontier_generate(CFG, feats(), backend="breadth", input_ids=ids, sampling=sampling, padded=padded)
            fr.check_invariants(total_token=20, depth=3, top_k=3, sampling=sampling)
            assert int(fr.draft_tokens[0, 0]) == 42
    # What the plugin declared is enforced before dispatch.
    with pytest.raises(frontier.InputError, match=r"backend 'breadth' supports dtypes float32; features_concat is float64"):
        frontier_generate(CFG, feats(dtype=torch.float64), backend="breadth")


def test_plugin_source_is_reported(plugins):
    rows = {r["name"]: r for r in frontier.backend_report()}
    assert rows["breadth"]["available"] is True
    assert rows["breadth"]["source"] == "frontier-test-plugin-good (entry point)"
    assert rows["stub"]["source"] == "frontier" and rows["stub"]["available"] is True
    assert rows["broken"]["available"] is False
    assert "libfoo.so" in rows["broken"]["why"]


def test_builtins_win_over_a_plugin_of_the_same_name(plugins):
    assert type(get_backend("stub")).__name__ == "StubBackend"
    assert "frontier_test_plugin_good" not in sys.modules


def test_broken_plugin_fails_clearly_and_breaks_nothing_else(plugins):
    with pytest.raises(BackendUnavailableError) as info:
        get_backend("broken")
    msg = str(info.value)
    assert "backend 'broken'" in msg
    assert "frontier_test_plugin_broken:Backend" in msg
    assert "frontier-test-plugin-broken (entry point)" in msg
    assert "ImportError: frontier_test_plugin_broken needs libfoo.so" in msg
    assert isinstance(info.value.__cause__, ImportError)
    # Asking again fails the same way (no half-registered state) ...
    with pytest.raises(BackendUnavailableError, match="failed to load"):
        frontier_generate(CFG, feats(), backend="broken")
    # ... and everything else still works.
    assert "broken" in available_backends()
    frontier_generate(CFG, feats(), backend="stub").check_invariants(total_token=20, depth=3, top_k=3)
    frontier_generate(CFG, feats(), backend="breadth").check_invariants(total_token=20, depth=3, top_k=3)


def test_cli_lists_plugins_and_the_broken_ones_reason(plugins, capsys):
    assert cli_main(["backends"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert "frontier-test-plugin-good (entry point)" in lines["breadth"] and " yes " in lines["breadth"]
    assert "no: backend 'broken'" in lines["broken"] and "libfoo.so" in lines["broken"]


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_env_switch_disables_autoload(plugins, monkeypatch, value):
    monkeypatch.setenv("FRONTIER_DISABLE_PLUGIN_AUTOLOAD", value)
    registry._reset_plugin_scan()
    assert available_backends() == BUILTINS
    with pytest.raises(BackendNotFoundError, match=f"unknown backend 'breadth'; registered backends: {', '.join(BUILTINS)}$"):
        get_backend("breadth")
    assert "frontier_test_plugin_good" not in sys.modules
    # Explicit registrations still work with autoload off.
    register_backend("breadth_explicit", "frontier_test_plugin_good:BreadthFirstBackend")
    assert type(get_backend("breadth_explicit")).__name__ == "BreadthFirstBackend"


@pytest.mark.parametrize("value", ["", "0", "false", "no"])
def test_env_switch_off_values_keep_autoload(plugins, monkeypatch, value):
    monkeypatch.setenv("FRONTIER_DISABLE_PLUGIN_AUTOLOAD", value)
    registry._reset_plugin_scan()
    assert "breadth" in available_backends()


def test_fresh_interpreter_discovers_plugin_lazily(plugins):
    """End to end in a new process: import frontier, list, then request the plugin."""
    code = textwrap.dedent(
        """
        import sys, torch, frontier
        assert "frontier_test_plugin_good" not in sys.modules
        names = frontier.available_backends()
        assert "frontier_test_plugin_good" not in sys.modules, "listing imported the plugin"
        cfg = frontier.FrontierConfig(total_token=9, depth=2, top_k=2, vocab_size=50, hidden_size=4)
        fr = frontier.frontier_generate(cfg, torch.zeros(1, 3, cfg.feature_size), backend="breadth")
        fr.check_invariants(total_token=9, depth=2, top_k=2)
        print("OK", ",".join(names))
        """
    )
    # (the caller's PYTHONPATH after ours: where the dependencies were installed onto it)
    path = ":".join(p for p in (str(plugins), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "PATH": "/usr/bin:/bin", "FRONTIER_DISABLE_PLUGIN_AUTOLOAD": ""}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "OK " + ",".join(sorted(BUILTINS + ["breadth", "broken"]))


# ----------------------------------------------------------------------------------------------
# Explicit registration
# ----------------------------------------------------------------------------------------------
class Recorder(Backend):
    """Delegates to the stub and remembers the request it got."""

    options = ("some_option",)

    def __init__(self):
        self.requests = []

    def generate(self, request):
        from frontier.backends.stub import StubBackend

        self.requests.append(request)
        return StubBackend().generate(request)


def test_register_instance_class_and_lazy_string():
    inst = Recorder()
    register_backend("rec", inst)
    assert get_backend("rec") is inst
    frontier_generate(CFG, feats(), backend="rec", seed=3, some_option=1)
    req = inst.requests[-1]
    assert req.seed == 3 and req.options == {"some_option": 1} and req.cfg is CFG

    register_backend("rec_cls", Recorder)
    first = get_backend("rec_cls")
    assert isinstance(first, Recorder) and get_backend("rec_cls") is first and first.name == "rec_cls"

    register_backend("stub_again", "frontier.backends.stub:StubBackend")
    assert type(get_backend("stub_again")).__name__ == "StubBackend"
    assert {"rec", "rec_cls", "stub_again"} <= set(available_backends())


def test_same_target_again_is_a_no_op():
    inst = Recorder()
    register_backend("rec", inst)
    register_backend("rec", inst)
    register_backend("cls", Recorder)
    register_backend("cls", Recorder)
    register_backend("stub", "frontier.backends.stub:StubBackend")  # the built-in's own target
    assert get_backend("rec") is inst


def test_different_target_under_a_taken_name_needs_clobber():
    register_backend("rec", Recorder())
    with pytest.raises(RegistryError) as info:
        register_backend("rec", Recorder())
    msg = str(info.value)
    assert "backend name 'rec' is already registered" in msg and "clobber=True" in msg
    with pytest.raises(RegistryError, match=r"'stub' is already registered to 'frontier.backends.stub:StubBackend'"):
        register_backend("stub", Recorder)
    assert type(get_backend("stub")).__name__ == "StubBackend"  # unchanged by the failed call

    replacement = Recorder()
    register_backend("stub", replacement, clobber=True)
    assert get_backend("stub") is replacement
    frontier_generate(CFG, feats(), backend="stub")
    assert len(replacement.requests) == 1


def test_bad_registrations_are_rejected():
    with pytest.raises(RegistryError, match="non-empty string"):
        register_backend("", Recorder)
    with pytest.raises(RegistryError, match=r"must look like 'module:attr', got 'frontier.backends.stub'"):
        register_backend("x", "frontier.backends.stub")
    with pytest.raises(RegistryError, match="must be a Backend instance or class or a 'module:attr' string, got int"):
        register_backend("x", 42)
    assert "x" not in available_backends()


def test_lazy_target_that_does_not_import_fails_on_request_only():
    register_backend("ghost", "frontier_test_plugin_missing.mod:Thing")  # registering imports nothing
    with pytest.raises(BackendUnavailableError, match=r"backend 'ghost'.*failed to load: ModuleNotFoundError"):
        get_backend("ghost")
    register_backend("attrless", "frontier.backends.stub:NoSuchBackend")
    with pytest.raises(BackendUnavailableError, match="AttributeError"):
        get_backend("attrless")

    class NoGenerate:
        pass

    register_backend("nogen", NoGenerate)
    with pytest.raises(BackendUnavailableError, match=r"backend 'nogen'.*has no generate\(request\) method"):
        get_backend("nogen")
    frontier_generate(CFG, feats(), backend="stub")  # the rest still works


def test_unknown_name_lists_registered_names():
    register_backend("zeta", Recorder)
    with pytest.raises(BackendNotFoundError) as info:
        get_backend("tritno")
    msg = str(info.value)
    assert msg == f"unknown backend 'tritno'; registered backends: {', '.join(BUILTINS)}, zeta"
    assert isinstance(info.value, FrontierError) and isinstance(info.value, KeyError)
    with pytest.raises(BackendNotFoundError, match="unknown backend 'tritno'; registered backends: stub,"):
        frontier_generate(CFG, feats(), backend="tritno")


def test_unregister():
    register_backend("tmp", Recorder)
    unregister_backend("tmp")
    assert "tmp" not in available_backends()
    with pytest.raises(BackendNotFoundError, match="unknown backend 'tmp'"):
        unregister_backend("tmp")


def test_builtins_declare_needs_and_support():
    for name in BUILTINS:
        b = get_backend(name)
        ok, why = b.availability()
        assert isinstance(ok, bool) and isinstance(why, str) and (ok or why)
        assert isinstance(b.requires_weights, bool)
        assert set(b.devices) <= {"cpu", "cuda"} and b.devices
        assert all(isinstance(d, torch.dtype) for d in b.dtypes)
    assert get_backend("stub").requires_weights is False
    assert get_backend("torch_ref").requires_weights is True


def test_builtin_backends_are_runnable_here():
    """conftest's runnable_backends() drops unavailable backends; a broken built-in must not
    vanish from the suite silently: stub and torch_ref always run, triton under the interpreter."""
    import os

    for name in ("stub", "torch_ref"):
        ok, why = frontier.get_backend(name).availability()
        assert ok, f"{name} unavailable: {why}"
    if os.environ.get("TRITON_INTERPRET") == "1":
        ok, why = frontier.get_backend("triton").availability()
        assert ok, f"triton unavailable under the interpreter: {why}"


def test_fallback_names_both_backends_when_neither_can_run():
    class Down(frontier.Backend):
        requires_weights = True

        def availability(self):
            return False, "down for maintenance"

    frontier.register_backend("down_one", Down())
    try:
        frontier.get_backend("torch_ref").availability = lambda: (False, "no torch_ref today")
        with pytest.raises(frontier.BackendUnavailableError, match="down for maintenance.*no torch_ref today"):
            frontier.frontier_generate(
                frontier.FrontierConfig(total_token=3, depth=1, top_k=2, vocab_size=8, hidden_size=4),
                torch.zeros(1, 1, 12), backend="down_one", fallback=True,
            )
    finally:
        del frontier.get_backend("torch_ref").availability  # back to the class's method
        frontier.unregister_backend("down_one")


# ----------------------------------------------------------------------------------------------
# Registration details: duck-typed targets, names, sources, lazy attribute paths, the report
# ----------------------------------------------------------------------------------------------
class DuckBackend:
    """Not a Backend subclass: anything with a callable generate(request) is accepted."""

    def generate(self, request):  # pragma: no cover - never drafted with
        raise AssertionError("not called")


class NamedDuck(DuckBackend):
    name = "my own name"


class PlainDuck(DuckBackend):
    """availability() but none of the optional declarations (requires_weights, devices)."""

    def availability(self):
        return True, ""


class ReadOnlyName(DuckBackend):
    @property
    def name(self):
        return ""


def test_base_backend_is_available_by_default():
    assert Backend().availability() == (True, "")


def test_duck_typed_instance_is_accepted_and_named_after_its_registration():
    duck = DuckBackend()
    register_backend("duck", duck)
    assert get_backend("duck") is duck and duck.name == "duck"
    named = NamedDuck()
    register_backend("named", named)
    assert get_backend("named").name == "my own name"
    read_only = ReadOnlyName()
    register_backend("read_only", read_only)
    assert get_backend("read_only") is read_only and read_only.name == ""


def test_objects_without_a_callable_generate_are_refused():
    class NotCallable:
        generate = "draft"

    for target, kind in ((NotCallable(), "NotCallable"), (object(), "object"), (3.5, "float")):
        with pytest.raises(RegistryError, match=(
            rf"^backend target for 'x' must be a Backend instance or class or a 'module:attr' string, got {kind}$"
        )):
            register_backend("x", target)
    assert "x" not in available_backends()


def test_registrations_are_reported_as_user_with_needs_and_devices():
    class Weighted(Backend):
        requires_weights = True
        devices = ("cuda",)

    register_backend("weighted", Weighted())
    register_backend("duck", DuckBackend())
    rows = {r["name"]: r for r in frontier.backend_report()}
    assert rows["weighted"] == {"name": "weighted", "available": True, "why": "", "source": "user", "needs": "weights",
                                "devices": "cuda"}
    assert rows["stub"] == {"name": "stub", "available": True, "why": "", "source": "frontier", "needs": "no weights",
                            "devices": "cpu,cuda"}
    # a duck without the optional attributes: availability() is required, so it fails into the report
    register_backend("plain_duck", PlainDuck())
    rows = {r["name"]: r for r in frontier.backend_report()}
    assert (rows["plain_duck"]["available"], rows["plain_duck"]["needs"], rows["plain_duck"]["devices"]) == (True, "no weights", "")
    assert rows["duck"]["available"] is False and rows["duck"]["needs"] == "?" and rows["duck"]["devices"] == "?"
    assert rows["duck"]["source"] == "user" and "availability" in rows["duck"]["why"]


def test_report_row_of_a_broken_plugin(plugins):
    rows = {r["name"]: r for r in frontier.backend_report()}
    broken = rows["broken"]
    assert (broken["available"], broken["needs"], broken["devices"]) == (False, "?", "?")
    assert broken["source"] == "frontier-test-plugin-broken (entry point)"


def test_no_generate_method_message_names_the_target():
    register_backend("nogen2", "frontier.registry:AUTOLOAD_ENV")  # resolves to a string
    with pytest.raises(BackendUnavailableError, match=(
        r"^backend 'nogen2' \('frontier.registry:AUTOLOAD_ENV'\) has no generate\(request\) method$"
    )):
        get_backend("nogen2")


def test_lazy_target_follows_a_dotted_attribute_path():
    register_backend("nested", "frontier:registry.Backend")
    backend = get_backend("nested")
    assert type(backend) is Backend and backend.name == "nested"
    register_backend("two_colons", "frontier.registry:Backend:extra")
    with pytest.raises(BackendUnavailableError, match=(
        r"^backend 'two_colons' \('frontier.registry:Backend:extra', from user\) failed to load: AttributeError: "
    )):
        get_backend("two_colons")


def test_conflict_message_describes_an_instance_target():
    register_backend("rec", Recorder())
    with pytest.raises(RegistryError, match=(
        r"^backend name 'rec' is already registered to test_registry.Recorder instance \(from user\); "
        r"pass clobber=True to replace it$"
    )):
        register_backend("rec", Recorder)
    register_backend("rec_cls", Recorder)
    with pytest.raises(RegistryError, match=r"^backend name 'rec_cls' is already registered to test_registry.Recorder \(from user\)"):
        register_backend("rec_cls", Recorder())


def test_unknown_name_with_nothing_registered():
    with registry._lock:
        registry._entries.clear()
    registry._plugins_scanned = True
    with pytest.raises(BackendNotFoundError, match=r"^unknown backend 'stub'; registered backends: \(none\)$"):
        get_backend("stub")


class FakeEntryPoint:
    """What importlib.metadata yields, with no distribution behind it (dist None)."""

    dist = None

    def __init__(self, name: str, value: str):
        self.name, self.value = name, value


class DistlessEntryPoint:
    """An entry point object without even a ``dist`` attribute."""

    def __init__(self, name: str, value: str):
        self.name, self.value = name, value


def test_entry_points_are_scanned_once_in_order_and_reset(monkeypatch):
    import importlib.metadata

    calls = []

    def fake_entry_points(group):
        calls.append(group)
        return [FakeEntryPoint("stub", "somewhere:Else"),  # taken by the built-in: skipped, scan goes on
                FakeEntryPoint("later", "frontier.backends.stub:StubBackend"),
                DistlessEntryPoint("last", "frontier.backends.stub:StubBackend")]

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    registry._reset_plugin_scan()
    assert "later" in available_backends() and "later" in available_backends()
    assert calls == ["frontier.backends"]
    rows = {r["name"]: r for r in frontier.backend_report()}
    assert rows["later"]["source"] == "entry point (entry point)" and rows["stub"]["source"] == "frontier"
    assert rows["last"]["source"] == "entry point (entry point)"
    registry._reset_plugin_scan()
    assert "later" not in registry._entries and registry._plugins_scanned is False
    assert "stub" in registry._entries  # only entry-point entries are forgotten
    available_backends()
    assert calls == ["frontier.backends", "frontier.backends"]
