#!/usr/bin/env bash
# Speculative generation over a tensor-parallel target on the GPUs of one host (NCCL): a random
# target of the Llama-3.1-8B shape in bf16, sharded by transformers' TP plan over N ranks, and the
# random EAGLE-3 head of the 8B preset, whole on every rank. Prints (rank 0): whether frontier's
# greedy output equals the TP target's own generate on every rank, tokens/s of both, the
# draft/verify/other split, the oracle upper bound, the per-step cost of the ranks' agreement check
# and what a rank-0 draft + broadcast would add per step. Writes $OUT/tp.json.
#
#   bash tools/gpu/tp.sh                      # 2 GPUs, 8B shape, triton, bf16
#   DTYPE=fp32 NEW_TOKENS=64 bash tools/gpu/tp.sh    # the same in fp32: the clean identity check
#   TP=2 SHAPE=tiny BACKEND=torch_ref bash tools/gpu/tp.sh     # the CPU equivalent (gloo) on a CPU box
#
# The random target is built once on GPU 0 and saved under $TP_STORE (default
# /tmp/frontier-tp-<shape>-<dtype>, 16 GB for 8B in bf16), then every rank loads its shards with
# tp_plan="auto"; a later call on the same machine reuses it.
#
# It also checks the target against itself: one forward over prompt + its own greedy output,
# whose argmax at every position should give back the next token. Where it does not (bf16 near-ties:
# a forward over many positions rounds differently from one-token decoding), a verify pass - a
# forward over many positions too - may pick another token than `generate` with no fault in the
# drafting; the report gives the first such position.
cd "$(dirname "$0")/../.."
source tools/gpu/env.sh
command -v nvidia-smi >/dev/null && nvidia-smi -L
OUT=${OUT:-/tmp/frontier-tp-out}
mkdir -p "$OUT"
export TP=${TP:-2} SHAPE=${SHAPE:-8b} BACKEND=${BACKEND:-triton} NEW_TOKENS=${NEW_TOKENS:-128} DTYPE=${DTYPE:-bf16}
export TP_STORE=${TP_STORE:-/tmp/frontier-tp-$SHAPE-$DTYPE} OUT
export TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
[ -n "$(command -v nvidia-smi)" ] || export OMP_NUM_THREADS=1
cat > "$OUT/tp_driver.py" <<'EOF'
import json, os, sys, time, warnings
import torch
import torch.distributed as dist
import frontier
from frontier import FrontierConfig
from frontier.generation import SpeculativeGenerator
from frontier.generation.distributed import load_tp_target, read_agreed, tp_group

warnings.filterwarnings("ignore")
SHAPES = {  # (target LlamaConfig fields, head preset fields)
    "8b": (dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256, rope_theta=500000.0),
           "eagle3-llama3.1-8b", (60, 5, 10), 128),
    "tiny": (dict(hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=256), None, (16, 4, 4), 32),
}
shape, backend, n_new = os.environ["SHAPE"], os.environ["BACKEND"], int(os.environ["NEW_TOKENS"])
store, out_dir = os.environ["TP_STORE"], os.environ["OUT"]
cuda = torch.cuda.is_available()
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
if cuda:
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo")
dtype = torch.bfloat16 if cuda and os.environ["DTYPE"] == "bf16" else torch.float32
tcfg_fields, head_preset, (T, D, K), p_len = SHAPES[shape]
world = dist.get_world_size()
log = print if rank == 0 else (lambda *a, **k: None)
sync = torch.cuda.synchronize if cuda else (lambda: None)
t_start = time.perf_counter()


def build_and_save():
    """Rank 0 builds the random target on its device (fast init there) and saves it once."""
    from transformers import LlamaConfig, LlamaForCausalLM
    if os.path.exists(os.path.join(store, "config.json")):
        return "reused"
    cfg = LlamaConfig(**tcfg_fields, max_position_embeddings=8192, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)  # drawn in the target dtype on the device: no second copy
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(store + ".part", max_shard_size="4GB")
    os.rename(store + ".part", store)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return "built"


state = build_and_save() if rank == 0 else None
dist.barrier()
log(f"[tp] target {shape} {state} in {time.perf_counter() - t_start:.0f} s; {world} ranks, "
    f"{'NCCL ' + torch.cuda.get_device_name(device) if cuda else 'gloo CPU'}; torch {torch.__version__}, "
    f"transformers {__import__('transformers').__version__}", flush=True)
t0 = time.perf_counter()
target = load_tp_target(store, dtype=dtype)
assert tp_group(target) is not None, "the target is not sharded"
log(f"[tp] loaded with tp_plan='auto' in {time.perf_counter() - t0:.0f} s; q_proj shard "
    f"{tuple(target.model.layers[0].self_attn.q_proj.weight.to_local().shape)}", flush=True)

# The head: the bench preset's random EAGLE-3 head (8B), or a tiny one of the tiny target's shape.
from frontier.bench import PRESETS, device_weights
if head_preset:
    cfg = FrontierConfig(total_token=T, depth=D, top_k=K, architecture="eagle3", **PRESETS[head_preset])
else:
    h = tcfg_fields["hidden_size"]
    cfg = FrontierConfig(total_token=T, depth=D, top_k=K, architecture="eagle3", hidden_size=h,
                         feature_size=3 * h, vocab_size=256, target_vocab_size=256, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2)
weights = device_weights(cfg, device=device, dtype=dtype, seed=0)  # the same on every rank
prompt = torch.randint(3, tcfg_fields["vocab_size"], (1, p_len), generator=torch.Generator().manual_seed(0)).to(device)
gkw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
report = dict(shape=shape, backend=backend, world=world, dtype=str(dtype), tree=[T, D, K], prompt=p_len,
              new_tokens=n_new, device=torch.cuda.get_device_name(device) if cuda else "cpu")


def timed(fn):
    sync(); dist.barrier(); t = time.perf_counter()
    r = fn()
    sync(); return r, time.perf_counter() - t


def all_ranks(flag):
    v = torch.tensor([int(flag)], device=device)
    dist.all_reduce(v, op=dist.ReduceOp.MIN)
    return bool(v.item())


with torch.no_grad():
    target.generate(prompt, max_new_tokens=4, **gkw)  # warm-up
    ref, dt_ref = timed(lambda: target.generate(prompt, max_new_tokens=n_new, **gkw))
    # the target against itself: does one forward over its own output give back each next token?
    logits = target(ref[:, :-1]).logits[0, p_len - 1:]
    if hasattr(logits, "full_tensor"):
        logits = logits.full_tensor()
    own = logits.argmax(-1) == ref[0, p_len:]
    self_diff = None if bool(own.all()) else int((~own).nonzero()[0, 0])
report["target_generate_tok_s"] = n_new / dt_ref
report["target_forward_first_disagreement"] = self_diff
log(f"[tp] target.generate (TP, greedy): {n_new / dt_ref:.1f} tok/s; the target's own forward over its output "
    f"{'gives back every token' if self_diff is None else f'first disagrees at new token {self_diff}'}", flush=True)


class Oracle(frontier.Backend):
    """The stub's tree with its deepest path set to the TP target's greedy continuation: the loop's
    upper bound when drafts are right (its draft time is the stub's)."""
    name, requires_weights, dtypes = "tp_oracle", False, (torch.float32, torch.float16, torch.bfloat16)

    def generate(self, request):
        from frontier.generation import tree_parents
        fr = frontier.get_backend("stub").generate(request)
        future = ref[0, request.input_ids.shape[1]:].tolist()
        tokens, parent, depth = fr.draft_tokens[0].tolist(), tree_parents(fr.tree_mask).tolist(), fr.tree_position_ids.tolist()
        node = max(range(len(depth)), key=lambda i: depth[i])
        path = []
        while node != 0:
            path.append(node); node = parent[node]
        for j, n in enumerate(reversed(path)):
            if j < len(future):
                tokens[n] = future[j]
        for n in path:  # siblings keep distinct tokens
            for s in range(1, len(parent)):
                if s != n and parent[s] == parent[n] and tokens[s] == tokens[n]:
                    tokens[s] = (tokens[s] + 1) % tcfg_fields["vocab_size"]
        fr.draft_tokens = torch.tensor([tokens], device=fr.draft_tokens.device)
        return fr


frontier.register_backend(Oracle.name, Oracle(), clobber=True)
rows = []
for name, w in ((backend, weights), (Oracle.name, None)):
    gen = SpeculativeGenerator(target, cfg, w, backend=name)
    t0 = time.perf_counter()
    gen.generate(prompt, max_new_tokens=min(16, n_new), eos_token_id=None)  # compiles the kernels
    warm = time.perf_counter() - t0
    out, dt = timed(lambda: gen.generate(prompt, max_new_tokens=n_new, eos_token_id=None, profile=False))
    prof = gen.generate(prompt, max_new_tokens=n_new, eos_token_id=None, profile=True).stats
    n = out.stats.new_tokens
    same = torch.equal(out.sequences, ref)
    diff = None if same else int((out.sequences[0] != ref[0]).nonzero()[0, 0]) - p_len
    row = dict(backend=name, identical_on_every_rank=all_ranks(same), first_difference=diff, tok_s=n / dt,
               speedup=(n / dt) / report["target_generate_tok_s"], mean_accepted=out.stats.mean_accepted_length,
               warmup_s=warm, ms_draft=1e3 * prof.time_draft / prof.verify_steps,
               ms_verify=1e3 * prof.time_verify / prof.verify_steps,
               ms_other=1e3 * (prof.time_other + prof.time_prefill) / prof.verify_steps, steps=prof.verify_steps)
    rows.append(row)
    log(f"[tp] frontier {name:>10}: identical on every rank={row['identical_on_every_rank']} (first diff {diff}) "
        f"{row['tok_s']:.1f} tok/s (x{row['speedup']:.2f}) acc {row['mean_accepted']:.2f}; per step draft "
        f"{row['ms_draft']:.2f} verify {row['ms_verify']:.2f} other+prefill {row['ms_other']:.2f} ms "
        f"({row['steps']} steps; warm-up {warm:.0f} s)", flush=True)
report["rows"] = rows

# Per-step costs of the alternatives: the agreement check (one all-reduce, read with the step's
# host read) vs a plain host read, and a rank-0 draft + broadcast of the tree (tokens, mask, depths).
group, reps = tp_group(target), 200
small = torch.zeros(1, 3 + min(T, D + 2), dtype=torch.long, device=device)
_, dt_plain = timed(lambda: [small.tolist() for _ in range(reps)])
_, dt_agree = timed(lambda: [read_agreed(small, group, 1) for _ in range(reps)])
tree = [torch.zeros(1, T, dtype=torch.long, device=device), torch.zeros(1, 1, T, T, dtype=dtype, device=device),
        torch.zeros(T, dtype=torch.long, device=device)]
_, dt_bcast = timed(lambda: [dist.broadcast(x, src=0) for _ in range(reps) for x in tree])
report.update(ms_host_read=1e3 * dt_plain / reps, ms_agreed_read=1e3 * dt_agree / reps,
              ms_broadcast_tree=1e3 * dt_bcast / reps)
log(f"[tp] per step: host read {report['ms_host_read']:.3f} ms, with the ranks' agreement check "
    f"{report['ms_agreed_read']:.3f} ms; a rank-0 draft would add a tree broadcast of "
    f"{report['ms_broadcast_tree']:.3f} ms (and every rank waits for rank 0's draft either way)", flush=True)
log(f"[tp] total {time.perf_counter() - t_start:.0f} s", flush=True)
if rank == 0:
    with open(os.path.join(out_dir, "tp.json"), "w") as f:
        json.dump(report, f, indent=1)
ok = all(r["identical_on_every_rank"] for r in rows)
dist.destroy_process_group()
sys.exit(0 if ok else 3)
EOF
timeout 570 python3 -m torch.distributed.run --standalone --nproc_per_node "$TP" "$OUT/tp_driver.py" 2>&1 \
  | grep -v -E "^(W|I)[0-9]{4} |OMP_NUM_THREADS|^\*+$|Loading weights|Writing model shards" | tail -c 11000
exit "${PIPESTATUS[0]}"
