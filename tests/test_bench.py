"""`frontier bench --batch`: what runs without a GPU.

The timing itself (CUDA events, the copy-bandwidth floor) needs CUDA; here: the ``--batch``
parsing, the ragged context spread, that a batch call is the same work every time and drafts
each sequence exactly as a single call on the same cache state would, the table's batch columns,
and ``run_case``'s wiring with the CUDA timer replaced.
"""

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest
import torch

import frontier
from frontier.batch import BatchDraftCache
from frontier.bench import (
    BatchCallSetup,
    BenchCase,
    BenchRow,
    CallSetup,
    batch1_ratios,
    check_batches,
    format_table,
    kv_bytes,
    row_json,
    run_bench,
    timing_reps,
)
from frontier.cli import main
from frontier.commands.bench import parse_batches
from frontier.random_head import random_config, random_weights
from gen_support import _one_thread  # noqa: F401  (autouse: one torch thread for the tiny heads)


def tiny_case(*, batch, context, new_rows, ragged=False, seed=0, depth=3, top_k=3, total_token=10, **dims):
    """A BenchCase over a tiny random eagle3 head (duck-typing a loaded DraftHead)."""
    cfg = random_config(total_token=total_token, depth=depth, top_k=top_k, **dims)
    w = random_weights(cfg, seed=seed)
    head = SimpleNamespace(config=lambda total_token, depth, top_k: cfg, weights=w)
    return BenchCase(preset="tiny", depth=depth, top_k=top_k, total_token=total_token, context=context,
                     new_rows=new_rows, batch=batch, head=head, ragged=ragged)


def slot_copy(cache: frontier.DraftCache) -> frontier.DraftCache:
    return frontier.DraftCache.from_tensors(cache.k.clone(), cache.v.clone(), cache.length)


# ----------------------------------------------------------------------------------------------
# --batch parsing


def test_parse_batches_accepts_comma_separated_positive_ints():
    assert parse_batches("1,4,16,64") == [1, 4, 16, 64]
    assert parse_batches("8") == [8]
    assert parse_batches(" 2, 3") == [2, 3]


@pytest.mark.parametrize("text", ["0", "-1", "a", "1,a", "", "1,,4", "2.5", "4,0"])
def test_parse_batches_refuses_bad_sizes_naming_the_flag(text):
    with pytest.raises(frontier.InputError, match="--batch") as err:
        parse_batches(text)
    assert repr(text) in str(err.value)


def test_parse_weights_keeps_each_format_once_and_refuses_others_naming_the_flag():
    from frontier.bench import parse_weights

    assert parse_weights("plain, fp8,plain") == ["plain", "fp8"]
    for bad in ("", "bf16", "fp8,int4"):
        with pytest.raises(frontier.InputError, match=f"--weights takes .*plain, fp8.*{bad!r}"):
            parse_weights(bad)
    assert main(["bench", "--weights", "int4"]) == 2


@pytest.mark.parametrize("text", ["0", "-1", "a", "1,x,4"])
def test_cli_refuses_a_bad_batch_before_anything_runs(text, capsys):
    assert main(["bench", "--batch", text]) == 2
    err = capsys.readouterr().err
    assert "--batch" in err and "positive integers" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cli_with_good_batches_reaches_the_cuda_check(capsys):
    assert main(["bench", "--batch", "1,4,16,64", "--ragged"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [[0], [1, -2], [True], [1.5], [], "4"])
def test_run_bench_refuses_bad_batch_lists(bad):
    with pytest.raises(frontier.InputError, match="batch"):
        run_bench(["eagle3-llama3.2-1b"], [5], backends=["torch_ref"], batches=bad)
    with pytest.raises(frontier.InputError, match="batch"):
        check_batches(bad)


def test_run_bench_refuses_a_context_without_cached_rows():
    with pytest.raises(frontier.InputError, match="context must exceed new_rows"):
        run_bench(["eagle3-llama3.2-1b"], [5], backends=["torch_ref"], batches=[4], context=4, new_rows=4)


# ----------------------------------------------------------------------------------------------
# contexts


def test_even_batches_share_the_context():
    assert BenchCase("p", 5, context=512, batch=16).contexts() == [512] * 16
    assert BenchCase("p", 5, context=512, batch=1, ragged=True).contexts() == [512]


@pytest.mark.parametrize("batch,context,new_rows", [(2, 512, 4), (4, 512, 4), (16, 100, 4), (64, 512, 4), (7, 9, 6)])
def test_ragged_contexts_spread_deterministically_around_the_context(batch, context, new_rows):
    case = BenchCase("p", 5, context=context, new_rows=new_rows, batch=batch, ragged=True)
    lengths = case.contexts()
    assert lengths == BenchCase("p", 5, context=context, new_rows=new_rows, batch=batch, ragged=True).contexts()
    assert len(lengths) == batch and len(set(lengths)) > 1
    assert min(lengths) >= new_rows + 1
    assert all(abs(n - context) <= 0.25 * context + 0.5 for n in lengths if n > new_rows + 1)
    if min(lengths) > new_rows + 1:  # no clamping: the spread is symmetric, its mean the context
        assert abs(sum(lengths) / batch - context) <= 0.5
        assert max(lengths) - min(lengths) >= 0.5 * context - 1
    if batch >= 4:
        assert lengths != sorted(lengths)  # the longest sequence is not simply the last


def test_bad_case_sizes_are_input_errors():
    with pytest.raises(frontier.InputError, match="batch"):
        BenchCase("p", 5, batch=0).contexts()
    with pytest.raises(frontier.InputError, match="new_rows"):
        BenchCase("p", 5, context=8, new_rows=0).contexts()


# ----------------------------------------------------------------------------------------------
# the batch call


@pytest.mark.parametrize(
    "seed,batch,context,new_rows,ragged,dims",
    [
        (0, 3, 17, 3, False, {}),
        (1, 5, 21, 3, True, dict(vocab_size=50, target_vocab_size=90)),
        (2, 4, 13, 5, True, dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=3, intermediate_size=40)),
        (3, 2, 9, 1, False, dict(vocab_size=37, target_vocab_size=61)),
    ],
)
def test_batch_call_is_the_same_work_every_time_and_drafts_each_sequence_exactly(seed, batch, context, new_rows,
                                                                                 ragged, dims):
    case = tiny_case(batch=batch, context=context, new_rows=new_rows, ragged=ragged, seed=seed, **dims)
    setup = BatchCallSetup(case, device="cpu", dtype=torch.float32, seed=seed)
    contexts = case.contexts()
    assert setup.contexts == contexts
    assert setup.prefill == [n - new_rows for n in contexts]
    assert isinstance(setup.cache, BatchDraftCache) and setup.cache.lengths == setup.prefill
    assert setup.cache.max_length == max(contexts) + 64
    assert [f.shape for f in setup.features] == [(1, new_rows, case.config().feature_size)] * batch
    assert [i.shape[1] for i in setup.ids] == [n + 1 for n in contexts]

    before = [slot_copy(slot) for slot in setup.cache]  # each slot's state at the start of a timed call
    first = setup.call("torch_ref")
    assert setup.cache.lengths == contexts  # the call committed every sequence's new rows
    after_first = [(slot.k.clone(), slot.v.clone()) for slot in setup.cache]
    for rep in range(2):
        again = setup.call("torch_ref")
        assert setup.cache.lengths == contexts
        assert all(a.same_tree(b) for a, b in zip(first, again))
        for slot, (k, v) in zip(setup.cache, after_first):  # rewrote the same rows with the same values
            assert torch.equal(slot.k, k) and torch.equal(slot.v, v)
    for b in range(batch):
        # the prefilled rows were never touched by the timed calls
        c = setup.prefill[b]
        assert torch.equal(setup.cache[b].k[:, :, :c], before[b].k[:, :, :c])
        assert torch.equal(setup.cache[b].v[:, :, :c], before[b].v[:, :, :c])
        single = frontier.frontier_generate(case.config(), setup.features[b], backend="torch_ref",
                                            input_ids=setup.ids[b], weights=setup.weights, cache=before[b],
                                            padded=True)
        assert first[b].same_tree(single), f"sequence {b}"
        assert first[b].padded and first[b].cache is setup.cache[b]
        first[b].check_invariants(total_token=case.total_token, depth=case.depth, top_k=case.top_k)
        # single-sequence drafting wrote the same new K/V rows into its copy
        assert torch.equal(before[b].k[:, :, : contexts[b]], setup.cache[b].k[:, :, : contexts[b]])


def test_even_batch_sequence_zero_is_the_batch_1_call():
    """Batch rows compare to batch-1 rows on like inputs: sequence 0 of an even batch is CallSetup's."""
    case = tiny_case(batch=3, context=15, new_rows=4, seed=5)
    one = CallSetup(BenchCase(**{**case.__dict__, "batch": 1}), device="cpu", dtype=torch.float32, seed=5)
    many = BatchCallSetup(case, device="cpu", dtype=torch.float32, seed=5)
    assert torch.equal(one.ids, many.ids[0]) and torch.equal(one.features, many.features[0])
    assert not torch.equal(many.ids[0], many.ids[1])  # each sequence draws its own inputs
    assert one.c == many.prefill[0]
    assert torch.equal(one.cache.k[:, :, : one.c], many.cache[0].k[:, :, : one.c])
    assert one.call("torch_ref").same_tree(many.call("torch_ref")[0])


def test_stub_backend_runs_without_weights():
    case = tiny_case(batch=4, context=12, new_rows=2, ragged=True, seed=7)
    setup = BatchCallSetup(case, device="cpu", dtype=torch.float32, seed=7)
    frs = setup.call("stub")
    assert setup.cache.lengths == setup.prefill  # the stub keeps no cache
    for b, fr in enumerate(frs):
        ref = frontier.frontier_generate(case.config(), setup.features[b], backend="stub", input_ids=setup.ids[b],
                                         padded=True)
        assert fr.same_tree(ref)
    single = CallSetup(BenchCase(**{**case.__dict__, "batch": 1, "ragged": False}), device="cpu",
                       dtype=torch.float32, seed=7)
    single.call("stub").check_invariants(total_token=case.total_token, depth=case.depth, top_k=case.top_k)


# ----------------------------------------------------------------------------------------------
# reps, rows and the table


def test_torch_ref_runs_fewer_reps_at_large_batches():
    assert timing_reps("triton", 64, 50) == (5, 50)
    assert timing_reps("torch_ref", 1, 50) == (5, 10)
    assert timing_reps("torch_ref", 4, 50) == (2, 3)
    assert timing_reps("torch_ref", 4, 200) == (2, 10)
    assert timing_reps("torch_ref", 64, 50) == (2, 3)


def test_kv_bytes_counts_every_sequence_per_forward():
    cfg = random_config(depth=5, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)  # head_dim 16
    row = 1 * 2 * 16 * 2 * 2  # layers x kv heads x head_dim x (k, v) x bf16 bytes
    assert kv_bytes(cfg, [10, 20, 30], torch.bfloat16) == 6 * 60 * row
    assert kv_bytes(cfg, [10], torch.float32) == 6 * 10 * 2 * row


def rows_fixture():
    b1 = BenchRow("8b", 7, 1, "GPU", floor_ms=1.5, weight_mb=6000,
                  results={"triton": 3.0, "triton kernel": 2.8, "torch_ref": 12.0}, contexts=[512])
    b16 = BenchRow("8b", 7, 16, "GPU", floor_ms=1.5, weight_mb=6000, results={"triton": 6.0, "torch_ref": 192.0},
                   contexts=[512] * 16, kv_mb=537.0)
    b4r = BenchRow("8b", 7, 4, "GPU", floor_ms=1.5, weight_mb=6000, results={"triton": 4.5}, ragged=True,
                   contexts=[400, 600, 450, 598])
    other = BenchRow("8b", 5, 4, "GPU", floor_ms=1.2, weight_mb=4800, results={"triton": 4.0})  # no batch-1 row
    return [b1, b16, b4r, other]


def test_batch1_ratios_come_from_the_matching_batch_1_row():
    rows = rows_fixture()
    assert batch1_ratios(rows, rows[0]) == {"triton": 1.0, "triton kernel": 1.0, "torch_ref": 1.0}
    assert batch1_ratios(rows, rows[1]) == {"triton": 2.0, "torch_ref": 16.0}
    assert batch1_ratios(rows, rows[2]) == {"triton": 1.5}
    assert batch1_ratios(rows, rows[3]) == {}


def table_cells(text):
    lines = text.splitlines()
    header = [c.strip() for c in lines[1].split(" | ")]
    body = [dict(zip(header, (c.strip() for c in line.split(" | ")))) for line in lines[3:]]
    return header, body


def test_batch_1_table_keeps_its_columns():
    text = format_table(rows_fixture()[:1], 4.0e12)
    header, body = table_cells(text)
    assert header == ["preset", "depth", "batch", "MB/call", "floor ms", "triton ms", "triton %floor",
                      "triton kernel ms", "triton kernel %floor", "torch_ref ms", "torch_ref %floor",
                      "triton speedup", "triton kernel speedup"]
    assert body[0]["triton ms"] == "3.000" and body[0]["triton %floor"] == "50.0%"
    assert body[0]["triton speedup"] == "4.00x"


def test_batch_table_adds_per_sequence_and_batch_1_ratio_columns():
    text = format_table(rows_fixture(), 4.0e12)
    header, body = table_cells(text)
    for v in ("triton", "triton kernel", "torch_ref"):
        assert f"{v} ms/seq" in header and f"{v} x b1" in header
    b1, b16, b4r, other = body
    assert b1["triton ms/seq"] == "3.000" and b1["triton x b1"] == "1.00x"
    assert b16["batch"] == "16"
    assert b16["triton ms"] == "6.000" and b16["triton %floor"] == "25.0%"
    assert b16["triton ms/seq"] == "0.375" and b16["triton x b1"] == "2.00x"
    assert b16["torch_ref ms/seq"] == "12.000" and b16["torch_ref x b1"] == "16.00x"
    assert b16["triton kernel ms"] == "-" and b16["triton kernel x b1"] == "-"  # no kernel-only at batch > 1
    assert b16["triton speedup"] == "32.00x"
    assert b4r["batch"] == "4 ragged" and b4r["triton x b1"] == "1.50x" and b4r["triton ms/seq"] == "1.125"
    assert other["triton ms/seq"] == "1.000" and other["triton x b1"] == "-"


def test_table_reports_the_packed_weight_copies_once_per_preset():
    rows = rows_fixture()
    for r in rows[:2]:
        r.packed_mb = 597.4
    rows.append(BenchRow("1b", 7, 1, "GPU", floor_ms=0.5, weight_mb=2000, results={"triton": 1.0}, packed_mb=231.2))
    lines = format_table(rows, 4.0e12).splitlines()
    assert lines[-1] == ("triton's packed weight copies and embedding-QKV table (Tuning.pack_weights, emb_table_mb; "
                         "kept per head): 8b 597 MB, 1b 231 MB")
    assert all("packed" not in line for line in lines[:-1])
    assert row_json(rows, rows[0])["packed_mb"] == 597.4
    assert "packed" not in format_table(rows_fixture(), 4.0e12)  # none made (e.g. torch_ref alone): no line


def test_json_rows_carry_the_same_fields():
    rows = rows_fixture()
    out = row_json(rows, rows[1])
    assert out["batch"] == 16 and out["results"] == {"triton": 6.0, "torch_ref": 192.0}
    assert out["per_seq_ms"] == {"triton": 0.375, "torch_ref": 12.0}
    assert out["x_b1"] == {"triton": 2.0, "torch_ref": 16.0}
    assert out["pct_floor"] == {"triton": 25.0, "torch_ref": pytest.approx(100 * 1.5 / 192)}
    assert out["kv_mb"] == 537.0 and out["contexts"] == [512] * 16 and out["ragged"] is False
    assert row_json(rows, rows[3])["x_b1"] == {}


# ----------------------------------------------------------------------------------------------
# run_case with the CUDA timer replaced


def test_run_case_wiring_on_cpu(monkeypatch):
    """run_case times each backend through the setup matching the batch, with torch_ref's reduced
    reps; CUDA events and the device name are stubbed (they cannot run here)."""
    import frontier.bench as bench

    timed = []

    def fake_time_calls(fn, *, warmup=5, reps=50):
        out = fn()
        timed.append((warmup, reps, out))
        return 1.0 + len(timed)

    monkeypatch.setattr(bench, "time_calls", fake_time_calls)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    case = tiny_case(batch=4, context=14, new_rows=3, ragged=True, seed=2)
    row = bench.run_case(case, backends=["torch_ref", "stub"], device="cpu", dtype=torch.float32,
                         bandwidth=1e12, reps=40, captured=False)
    assert [t[:2] for t in timed] == [(2, 3), (5, 40)]
    assert isinstance(timed[0][2], list) and len(timed[0][2]) == 4  # a batch call: one Frontier per sequence
    assert row.batch == 4 and row.ragged and row.contexts == case.contexts()
    assert row.results == {"torch_ref": 2.0, "stub": 3.0}
    cfg = case.config()
    assert row.weight_mb == pytest.approx(bench.floor_bytes(cfg, case.head.weights) / 1e6)  # the batch-1 floor
    assert row.kv_mb == pytest.approx(kv_bytes(cfg, case.contexts(), torch.float32) / 1e6)

    timed.clear()
    one = BenchCase(**{**case.__dict__, "batch": 1, "ragged": False})
    row1 = bench.run_case(one, backends=["torch_ref"], device="cpu", dtype=torch.float32, bandwidth=1e12, reps=40,
                          captured=False)
    assert [t[:2] for t in timed] == [(5, 10)]
    assert isinstance(timed[0][2], frontier.Frontier)  # batch 1 stays the single-sequence call
    assert row1.floor_ms == row.floor_ms and not row1.ragged


def test_cli_persistent_flag_reaches_run_bench(monkeypatch, capsys):
    """``--persistent`` asks run_bench for triton's mode='persistent' columns (run_bench stubbed: no
    GPU here)."""
    import frontier.bench as bench

    seen = {}

    def fake_run_bench(presets, depths, **kw):
        seen.update(kw, presets=presets, depths=depths)
        return "table"

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    assert main(["bench", "--persistent", "--batch", "1,16", "--depth", "7", "--backend", "triton"]) == 0
    assert seen["persistent"] is True and seen["batches"] == [1, 16] and seen["depths"] == [7]
    assert seen["backends"] == ["triton"] and "table" in capsys.readouterr().out
    assert seen["captured"] is True  # the captured rows by default
    assert main(["bench", "--depth", "7", "--no-captured"]) == 0 and seen["captured"] is False
    assert main(["bench", "--depth", "7"]) == 0 and seen["persistent"] is False
    assert seen["backends"] == ["triton", "torch_ref"] and seen["dtype"] is torch.bfloat16
    # --backends: the old spelling of the same list, still taken
    assert main(["bench", "--backends", "torch_ref,triton", "--dtype", "float16"]) == 0
    assert seen["backends"] == ["torch_ref", "triton"] and seen["dtype"] is torch.float16


def test_cli_json_prints_and_json_out_writes(monkeypatch, capsys, tmp_path):
    """``--json`` prints the results as JSON (as every subcommand's --json does); ``--json-out PATH``
    writes them to PATH (run_bench stubbed: no GPU here)."""
    import frontier.bench as bench

    seen = {}

    def fake_run_bench(presets, depths, *, json_path=None, **kw):
        seen["json_path"] = json_path
        if json_path:
            with open(json_path, "w") as fh:
                json.dump({"rows": [], "depths": depths}, fh)
        return "table"

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    assert main(["bench", "--depth", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"rows": [], "depths": [5]}
    assert not os.path.exists(seen["json_path"])  # the scratch file is gone
    out = tmp_path / "bench.json"
    assert main(["bench", "--depth", "7", "--json-out", str(out)]) == 0
    assert capsys.readouterr().out == "table\n" and json.loads(out.read_text())["depths"] == [7]
    assert main(["bench", "--json", "--json-out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(out.read_text())
    # the old `--json PATH` is refused, not taken as a path
    assert main(["bench", "--json", str(out)]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_run_case_times_the_persistent_mode_only_when_asked(monkeypatch):
    """run_case adds a 'triton persistent' variant (the same call with mode='persistent') when
    persistent=True; 'triton' is the backend's default mode."""
    import frontier.bench as bench

    calls = []

    case = tiny_case(batch=1, context=8, new_rows=2)

    class FakeSetup:
        def __init__(self, case, **kw):
            self.cfg, self.weights = case.config(), case.head.weights

        def call(self, backend, **options):
            calls.append((backend, options.get("mode")))

    monkeypatch.setattr(bench, "CallSetup", FakeSetup)
    monkeypatch.setattr(bench, "time_calls", lambda fn, warmup=5, reps=50: (fn(), 1.0)[1])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    row = bench.run_case(case, backends=["triton"], device="cpu", dtype=torch.float32, bandwidth=1e12,
                         kernel_only=False, persistent=True, captured=False)
    assert calls == [("triton", None), ("triton", "persistent")]
    assert set(row.results) == {"triton", "triton persistent"}
    calls.clear()
    row = bench.run_case(case, backends=["triton"], device="cpu", dtype=torch.float32, bandwidth=1e12,
                         kernel_only=False, captured=False)
    assert calls == [("triton", None)] and set(row.results) == {"triton"}


@pytest.fixture
def fake_timer(monkeypatch):
    """run_case on the CPU: each setup call returns its backend's name, each launch helper a label,
    and the timer records (what the timed function returned, device_only) and answers 2.0 ms for
    device time, 3.0 for the rest. Returns the record."""
    import frontier.bench as bench

    timed = []

    class FakeSetup:
        def __init__(self, case, **kw):
            self.cfg, self.weights = case.config(), case.head.weights

        def call(self, backend, **options):
            return backend

    def fake_time_calls(fn, *, warmup=5, reps=50, device_only=False):
        timed.append((fn(), device_only))
        return 2.0 if device_only else 3.0

    monkeypatch.setattr(bench, "CallSetup", FakeSetup)
    monkeypatch.setattr(bench, "time_calls", fake_time_calls)
    monkeypatch.setattr(bench, "triton_kernel_only", lambda setup, mode="graph": f"launch {mode}")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return timed


def test_kernel_only_times_the_launch_with_and_without_its_host_work(fake_timer):
    """kernel_only adds 'triton launch' (one launch, the GPU idle while the host prepares it) and
    'triton kernel' (the same launch timed as device work alone: time_calls(device_only=True)),
    and with persistent=True 'triton persistent' and 'triton persistent kernel' (the one
    cooperative launch's device work alone)."""
    import frontier.bench as bench

    case, timed = tiny_case(batch=1, context=8, new_rows=2), fake_timer
    row = bench.run_case(case, backends=["triton"], device="cpu", dtype=torch.float32, bandwidth=1e12,
                         captured=False)
    assert timed == [("triton", False), ("launch graph", False), ("launch graph", True)]
    assert row.results == {"triton": 3.0, "triton launch": 3.0, "triton kernel": 2.0}
    # with persistent=True also the one-launch mode, whole call and device time alone
    timed.clear()
    row = bench.run_case(case, backends=["triton"], device="cpu", dtype=torch.float32, bandwidth=1e12,
                         persistent=True, captured=False)
    assert timed == [("triton", False), ("launch graph", False), ("launch graph", True), ("triton", False),
                     ("launch persistent", True)]
    assert row.results == {"triton": 3.0, "triton launch": 3.0, "triton kernel": 2.0, "triton persistent": 3.0,
                           "triton persistent kernel": 2.0}


def test_captured_rows_time_the_drafters_replay(monkeypatch, fake_timer):
    """captured=True (the default) adds '<backend> captured' for triton and torch_ref (a Drafter's
    whole step replayed, host included) and, with kernel_only, 'triton captured kernel' (the same
    replay's device time alone)."""
    import frontier.bench as bench

    case, timed = tiny_case(batch=1, context=8, new_rows=2), fake_timer

    class FakeDrafter:
        def __init__(self, backend):
            self.backend = backend

        def replay(self, commit=True):
            assert commit is False  # every replay drafts the same rows from the same cache
            return f"replay {self.backend}"

    monkeypatch.setattr(bench, "static_drafter", lambda setup, backend: FakeDrafter(backend))
    row = bench.run_case(case, backends=["torch_ref", "stub"], device="cpu", dtype=torch.float32, bandwidth=1e12)
    assert timed == [("torch_ref", False), ("replay torch_ref", False), ("stub", False)]
    assert set(row.results) == {"torch_ref", "torch_ref captured", "stub"}
    timed.clear()
    row = bench.run_case(case, backends=["triton"], device="cpu", dtype=torch.float32, bandwidth=1e12)
    assert timed == [("triton", False), ("launch graph", False), ("launch graph", True), ("replay triton", False),
                     ("replay triton", True)]
    assert set(row.results) == {"triton", "triton launch", "triton kernel", "triton captured",
                                "triton captured kernel"}


@pytest.mark.parametrize("batch", [1, 3])
def test_static_drafter_holds_the_setups_call(batch):
    """The captured rows time the same work as the call rows: a Drafter whose slots hold the
    setup's caches and staged rows drafts the trees the setup's call drafts."""
    import frontier.bench as bench

    case = tiny_case(batch=batch, context=12, new_rows=3, ragged=batch > 1, seed=4)
    make = bench.CallSetup if batch == 1 else bench.BatchCallSetup
    setup = make(case, device="cpu", dtype=torch.float32)
    d = bench.static_drafter(setup, "torch_ref")
    for _ in range(2):  # replays leave the lengths: the same tree every time
        d.replay(commit=False)
    refs = setup.call("torch_ref")
    refs = refs if isinstance(refs, list) else [refs]
    assert len(refs) == batch and d.buffers.lengths.tolist() == [c.length - case.new_rows for c in
                                                                 (r.cache for r in refs)]
    for b, ref in enumerate(refs):
        assert d.frontier(b).same_tree(ref)


def test_phase_totals_sums_each_phase_over_depths_from_median_step_times():
    """The in-kernel breakdown: per schedule entry the median over runs (us), summed per phase
    name in ms, context-step phases apart."""
    from frontier.backends.triton.kernels import CONTEXT_STEP, Phase
    from frontier.backends.triton.schedule import build_schedule
    from frontier.bench import phase_totals

    sched = build_schedule("eagle3", 2)
    runs = [[float(j + 1) for j in range(len(sched))], [float(3 * (j + 1)) for j in range(len(sched))],
            [float(2 * (j + 1)) for j in range(len(sched))]]  # median of each entry: 2 * (j + 1) us
    per = phase_totals(sched, runs)
    expect: dict[str, float] = {}
    for j, code in enumerate(sched):
        ph, i = divmod(code, 256)
        name = Phase(ph).name.lower()
        key = ("ctx " if i == CONTEXT_STEP else "") + name
        expect[key] = expect.get(key, 0.0) + 2 * (j + 1) / 1e3
    assert per == pytest.approx(expect)
    assert per["lmhead"] == pytest.approx(sum(2 * (j + 1) / 1e3 for j, c in enumerate(sched)
                                              if c // 256 == Phase.LMHEAD and c % 256 != CONTEXT_STEP))
    assert "ctx fc" in per and "fc" not in per and "final" in per


def test_fp8_rows_get_a_weights_column_and_their_own_batch_1_ratio():
    rows = rows_fixture()[:2]
    fp8 = [dataclasses.replace(r, weights="fp8", results={k: v / 2 for k, v in r.results.items()}) for r in rows]
    header, body = table_cells(format_table(rows + fp8, 4.0e12))
    assert header[:3] == ["preset", "weights", "depth"]
    assert [b["weights"] for b in body] == ["plain", "plain", "fp8", "fp8"]
    assert body[3]["triton x b1"] == body[1]["triton x b1"] == "2.00x"  # each format against its own batch 1
    assert "weights" not in table_cells(format_table(rows, 4.0e12))[0]
