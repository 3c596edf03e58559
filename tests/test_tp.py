"""Speculative generation over a tensor-parallel target: two CPU processes over gloo.

transformers' tensor parallelism runs on the CPU: ``from_pretrained(..., tp_plan="auto")`` (here
through :func:`frontier.generation.distributed.load_tp_target`) with a gloo process group shards the
tiny random Llama target's projections as DTensors over a 1-D CPU device mesh, exactly as it does
over NCCL on GPUs. Each test spawns two ranks (``torch.multiprocessing``, spawn start method) that
load the saved target with its TP plan and the saved head whole, run the cases, and write what they
got to a JSON file per rank, which the test compares.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import frontier
from frontier.backends.stub import StubBackend
from frontier.generation import random_pair
from frontier.generation.distributed import (
    RankDivergenceError, check_agreement, check_tp_size, read_agreed, tp_group,
)
from frontier.loading import save_draft_head
from frontier.registry import Backend, register_backend
from gen_support import V, plant_continuation

WORLD = 2
TIMEOUT_S = 120  # a hung collective fails the test instead of the CI job
N_NEW = 20


# ----------------------------------------------------------------------------------------------
# What every rank runs
# ----------------------------------------------------------------------------------------------
class _Oracle(Backend):
    """The stub's tree with one deep path carrying the target's greedy continuation up to a random
    depth (seeded: the same on every rank unless ``seed`` differs), so accepted runs of every
    length go through the sharded KV cache's compaction."""

    name = "tp_oracle"
    requires_weights = False
    dtypes = (torch.float32,)

    def __init__(self, reference: list[int], seed: int) -> None:
        self.reference, self.rng = reference, random.Random(seed)

    def generate(self, request):
        fr = StubBackend().generate(request)
        ids = request.input_ids[0].tolist()
        return plant_continuation(fr, self.reference[len(ids):], self.rng)


def _prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(3, V, (1, length), generator=torch.Generator().manual_seed(seed))  # [1, P]


def _cases(target, cfg, weights, rank: int) -> dict:
    """Every case's tokens on this rank (and whether they equal the TP target's greedy generate)."""
    got: dict = {}
    ids = _prompt(7, 12)
    ref = target.generate(ids, do_sample=False, max_new_tokens=N_NEW, eos_token_id=None, pad_token_id=0)
    got["reference"] = ref[0].tolist()
    for backend in ("stub", "torch_ref"):
        out = frontier.generate(target, ids, cfg=cfg, weights=weights, backend=backend,
                                max_new_tokens=N_NEW, eos_token_id=None)
        got[backend] = out.sequences[0].tolist()
    register_backend(_Oracle.name, _Oracle(got["reference"], seed=0), clobber=True)
    out = frontier.generate(target, ids, cfg=cfg, backend=_Oracle.name, max_new_tokens=N_NEW, eos_token_id=None)
    got["oracle"], got["oracle_accepted"] = out.sequences[0].tolist(), out.stats.accepted_lengths
    short = _prompt(8, 5)
    batch = frontier.generate(target, [ids[0], short[0]], cfg=cfg, weights=weights, backend="torch_ref",
                              max_new_tokens=[N_NEW, 9], eos_token_id=None)
    got["batch"] = [r.sequences[0].tolist() for r in batch]
    got["batch_reference"] = [
        got["reference"],
        target.generate(short, do_sample=False, max_new_tokens=9, eos_token_id=None, pad_token_id=0)[0].tolist(),
    ]
    for name, seed in (("sampled_seed", 3), ("sampled_shared_seed", None)):
        out = frontier.generate(target, ids, cfg=cfg, weights=weights, backend="torch_ref", max_new_tokens=N_NEW,
                                eos_token_id=None, temperature=0.8, seed=seed)
        got[name] = out.sequences[0].tolist()
    # A drafter that differs between ranks: every rank must raise, none may hang.
    register_backend(_Oracle.name, _Oracle(got["reference"], seed=1 + rank), clobber=True)
    try:
        frontier.generate(target, ids, cfg=cfg, backend=_Oracle.name, max_new_tokens=N_NEW, eos_token_id=None)
        got["divergence"] = None
    except RankDivergenceError as exc:
        got["divergence"] = str(exc)
    return got


def _sharded_outputs(tmp: str) -> dict:
    """A TP plan whose lm_head leaves the logits sharded is refused; a DTensor output is gathered."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    from frontier.generation.target import _full

    got = {}
    plan = {"lm_head": "colwise", **{f"model.layers.*.{m}": "colwise" for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")},
        "model.layers.*.self_attn.o_proj": "rowwise", "model.layers.*.mlp.down_proj": "rowwise"}
    target = AutoModelForCausalLM.from_pretrained(f"{tmp}/target", distributed_config=DistributedConfig(tp_plan=plan),
                                                  dtype=torch.float32).eval()
    try:
        frontier.generate(target, _prompt(7, 12), cfg=frontier.load_draft_head(f"{tmp}/head").config(
            total_token=16, depth=4, top_k=4), backend="stub", max_new_tokens=4, eos_token_id=None)
        got["sharded_logits"] = None
    except frontier.InputError as exc:
        got["sharded_logits"] = str(exc)
    whole = torch.arange(2 * WORLD * 3, dtype=torch.float32).view(2, 3 * WORLD)  # [2, 3 * WORLD]
    rank = torch.distributed.get_rank()
    local = whole[:, 3 * rank : 3 * (rank + 1)]  # this rank's columns
    dt = DTensor.from_local(local, init_device_mesh("cpu", (WORLD,)), [Shard(1)], run_check=False)
    got["gathered"] = torch.equal(_full(dt), whole) and _full(whole) is whole
    return got


def _rank_main(rank: int, tmp: str) -> None:
    """One rank: join the gloo group, load the target with its TP plan and the head, run the cases."""
    import torch.distributed as dist

    from frontier.generation.distributed import load_tp_target

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=WORLD)
    try:
        target = load_tp_target(f"{tmp}/target", dtype=torch.float32)
        head = frontier.load_draft_head(f"{tmp}/head")
        got = _cases(target, head.config(total_token=16, depth=4, top_k=4), head.weights, rank)
        got["sharded"] = tp_group(target) is not None
        got.update(_sharded_outputs(tmp))
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def _spawn(tmp: Path) -> list[dict]:
    """Run ``_rank_main`` on WORLD spawned processes; their results, rank by rank."""
    ctx = torch.multiprocessing.start_processes(_rank_main, args=(str(tmp),), nprocs=WORLD, join=False,
                                                start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {WORLD} ranks did not finish within {TIMEOUT_S} s (a hung collective?)")
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory) -> Path:
    """The tiny random target (8 layers, 4 heads, 2 kv heads) and its EAGLE-3 head, saved."""
    tmp = tmp_path_factory.mktemp("tp")
    target, cfg, w = random_pair("tiny", total_token=16, depth=4, top_k=4, seed=0)
    target.save_pretrained(tmp / "target")
    save_draft_head(w, cfg, tmp / "head", include_embedding=True, overwrite=True)
    return tmp


@pytest.fixture(scope="module")
def ranks(saved_pair) -> list[dict]:
    return _spawn(saved_pair)


# ----------------------------------------------------------------------------------------------
# Two gloo ranks
# ----------------------------------------------------------------------------------------------
def test_target_is_sharded_on_every_rank(ranks):
    assert all(r["sharded"] for r in ranks)


@pytest.mark.parametrize("backend", ["stub", "torch_ref", "oracle"])
def test_greedy_equals_the_tp_targets_generate_on_every_rank(ranks, backend):
    for rank, got in enumerate(ranks):
        assert got[backend] == got["reference"], f"rank {rank}, backend {backend}"
    assert ranks[0]["reference"] == ranks[1]["reference"]


def test_oracle_runs_are_accepted_through_the_sharded_cache(ranks):
    accepted = ranks[0]["oracle_accepted"]
    assert max(accepted) > 2, accepted
    assert all(r["oracle_accepted"] == accepted for r in ranks)


def test_batch_equals_the_tp_targets_generate(ranks):
    for got in ranks:
        assert got["batch"] == got["batch_reference"]


@pytest.mark.parametrize("case", ["sampled_seed", "sampled_shared_seed"])
def test_sampling_is_the_same_on_every_rank(ranks, case):
    assert len(ranks[0][case]) == 12 + N_NEW
    assert all(r[case] == ranks[0][case] for r in ranks)


def test_a_plan_that_shards_the_logits_is_refused(ranks):
    for got in ranks:
        assert "leaves the lm_head's output sharded" in got["sharded_logits"]


def test_a_dtensor_output_is_gathered_whole(ranks):
    assert all(got["gathered"] for got in ranks)


def test_a_rank_that_diverges_stops_every_rank(ranks):
    for got in ranks:
        assert got["divergence"] is not None and "ranks of the tensor-parallel target" in got["divergence"]


@pytest.mark.slow  # ~20 s: torch.distributed.run and two more interpreters; the spawned ranks above cover the loop
def test_cli_tp_matches_the_targets_generate():
    """``frontier generate --tp 2`` relaunches through torch.distributed.run; only rank 0 prints."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("FRONTIER_TP_WORKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "frontier.cli", "generate", "--random-tiny", "--tp", "2", "--compare",
         "--max-new-tokens", "8", "--json"],
        capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout  # rank 0 only
    report = json.loads(lines[0])
    assert report["compare"]["identical"] is True
    assert len(report["new_token_ids"]) == 8
    assert "2 tensor-parallel ranks" in report["source"]


# ----------------------------------------------------------------------------------------------
# One process
# ----------------------------------------------------------------------------------------------
def test_agreement_check_passes_equal_ranks_and_names_a_divergence():
    local = torch.tensor([[0, 2, 17, 5, 9], [0, 0, 4, 3, -1]])  # [A, W]
    check_agreement(local, local.clone(), local.clone(), step=3)
    high = local.clone()
    high[1, 2] = 5
    with pytest.raises(RankDivergenceError, match=r"verify step 3: .*sequence\(s\) \[1\]"):
        check_agreement(local, high, local, step=3)
    with pytest.raises(RankDivergenceError):  # the group agrees, this rank does not
        check_agreement(local, high, high, step=4)


def test_single_device_reads_without_a_collective():
    small = torch.tensor([[0, 1, 7, 3, 4]])
    assert read_agreed(small, None, step=1) == small.tolist()
    target, _, _ = random_pair("tiny", seed=0)
    assert tp_group(target) is None


def test_tp_size_must_divide_the_heads():
    from types import SimpleNamespace

    check_tp_size(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), 2)
    with pytest.raises(frontier.InputError, match="tensor-parallel size 4 must divide .* 2 key/value heads"):
        check_tp_size(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), 4)
    with pytest.raises(frontier.InputError, match="integer >= 1, got 0"):
        check_tp_size(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), 0)


@pytest.mark.parametrize("argv, message", [
    (["--tp", "0"], "argument --tp: must be a positive integer"),
    (["--tp", "4"], "tensor-parallel size 4 must divide the random tiny target's 4 attention heads and 2"),
])
def test_cli_refuses_bad_tp(capsys, argv, message):
    from frontier.cli import main

    assert main(["generate", "--random-tiny", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_more_ranks_than_gpus(monkeypatch, capsys):
    from frontier.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["generate", "--random-tiny", "--tp", "2", "--device", "cuda"]) == 2
    assert "--tp 2 needs 2 CUDA devices, this machine has 1" in capsys.readouterr().err
