"""Planning a load from metadata only: every check a load makes before it reads a weight.

:func:`_plan` reads config.json and the checkpoint headers, matches the head's tensors against
the shapes its config implies, checks the EAGLE-3 vocabulary mapping (``d2t``/``t2d``) and
finds the tensors the head does not ship (the embedding; the EAGLE-2 lm_head) in the target.
Problems are collected in a :class:`_Plan` as fatal errors, strict-only issues and notes, so
that a load can raise them all at once and ``describe_draft_head`` can list them.

fp8 heads: a linear weight (:func:`frontier.weights.is_linear_key`) may be stored as
float8_e4m3fn next to its float32 per-output-channel scale ``<key>_scale`` (shape ``[out]``).
Such pairs are recorded in ``_Plan.fp8_keys`` and left out of the "one floating dtype" check;
``stored_dtype`` is then the dtype of the other floating tensors (the activation dtype).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from ..config import detect_architecture
from ..errors import InputError, WeightsError
from ..weights import FP8, LINEAR_NAMES, is_8bit_float, is_linear_key, scale_key, scale_owner
from .checkpoint import CheckpointFiles, TensorInfo
from .config_json import HeadDims, _dims_from_config
from .files import PathLike, _dt, _read_json, _read_json_file, _shape

#: Keys the public checkpoints may carry that describe nothing to load (recomputed from the config).
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclass
class _External:
    """A tensor the head does not ship (the embedding, or the eagle2 lm_head)."""

    source: str  # human description
    shape: tuple[int, ...]
    dtype: torch.dtype
    fetch: Any  # () -> CPU/any-device tensor
    where: str  # for messages
    shared: bool = False  # the caller's tensor (explicit or a loaded model's): share it when dtype/device match


@dataclass
class _Plan:
    path: Path
    hf_config: dict
    files: Optional[CheckpointFiles]
    architecture: Optional[str]
    arch_note: str
    dims: Optional[HeadDims]
    head_info: dict[str, TensorInfo] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # always fatal
    strict_issues: list[str] = field(default_factory=list)  # fatal when strict, warnings otherwise
    notes: list[str] = field(default_factory=list)  # warnings
    embedding: Optional[_External] = None
    embedding_source: str = ""
    lm_head: Optional[_External] = None
    lm_head_source: str = ""
    stored_dtype: Optional[torch.dtype] = None  # of the floating tensors other than fp8 linears and their scales
    fp8_keys: set[str] = field(default_factory=set)  # head linears stored as float8_e4m3fn (with a valid scale)
    d2t: Optional[torch.Tensor] = None  # validated offsets (None: identity)
    d2t_summary: dict = field(default_factory=dict)

    def problems(self, strict: bool) -> list[str]:
        return self.errors + (self.strict_issues if strict else [])

    def warnings(self, strict: bool) -> list[str]:
        return ([] if strict else self.strict_issues) + self.notes


def _raise_problems(problems: list[str], path: Path) -> None:
    if not problems:
        return
    if len(problems) == 1:
        raise WeightsError(problems[0])
    shown = problems[:12]
    more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    raise WeightsError(
        f"cannot load the draft head in {str(path)!r}: {len(problems)} problems:\n  " + "\n  ".join(shown) + more
    )


def _check_fp8(plan: _Plan, expected: dict[str, tuple[int, ...]], info: dict[str, TensorInfo], arch: str) -> None:
    """The fp8 layout: every float8_e4m3fn tensor is a linear weight with a float32 ``[out]``
    scale ``<key>_scale``, and every scale belongs to such a weight. Records ``plan.fp8_keys``."""
    for key, t in info.items():
        if key not in expected or not is_8bit_float(t.dtype) or (arch == "eagle2" and key == "lm_head.weight"):
            continue  # (the eagle2 head's own lm_head is ignored: a strict issue)
        where = f"head file {str(t.file)!r}: tensor {key!r}"
        if t.dtype != FP8:
            plan.errors.append(f"{where} is {_dt(t.dtype)}; fp8 weights must be float8_e4m3fn (e4m3) with a float32 scale")
        elif not is_linear_key(key):
            plan.errors.append(
                f"{where} is float8_e4m3fn, expected a floating activation dtype (float32, float16 or bfloat16): "
                f"only linear weights ({LINEAR_NAMES}) may be fp8; embeddings, norms "
                "and biases stay in the activation dtype"
            )
        elif scale_key(key) not in info:
            plan.errors.append(
                f"{where} is float8_e4m3fn but the head has no scale for it: expected tensor {scale_key(key)!r} "
                f"float32 {_shape(expected[key][:1])} (one per output channel), found none"
            )
        else:
            plan.fp8_keys.add(key)
    for skey, t in info.items():
        wkey = scale_owner(skey)
        if wkey is None:
            continue
        where = f"head file {str(t.file)!r}: fp8 scale {skey!r}"
        if wkey not in expected or not is_linear_key(wkey):
            what = "is not a tensor of" if wkey not in expected else "is not a linear weight of"
            plan.errors.append(
                f"{where} belongs to {wkey!r}, which {what} an {arch} head with this config; fp8 scales belong to "
                f"linear weights ({LINEAR_NAMES})"
            )
            plan.fp8_keys.discard(wkey)
            continue
        if arch == "eagle2" and wkey == "lm_head.weight" and wkey in info:
            continue  # ignored together with the eagle2 head's own lm_head (a strict issue)
        if wkey not in info:
            plan.errors.append(f"{where} belongs to {wkey!r}, which the head does not ship (expected an fp8 "
                               f"{_shape(expected[wkey])} weight beside it)")
            continue
        want = (expected[wkey][0],)
        if t.dtype != torch.float32 or tuple(t.shape) not in (want, want + (1,)):
            plan.errors.append(
                f"{where} has dtype {_dt(t.dtype)} and shape {_shape(t.shape)}, expected float32 {_shape(want)} "
                f"or {_shape(want + (1,))} (one per output channel of {wkey!r})"
            )
            plan.fp8_keys.discard(wkey)
        if info[wkey].dtype != FP8:
            plan.errors.append(
                f"{where} belongs to {wkey!r}, which is {_dt(info[wkey].dtype)}, expected float8_e4m3fn (a scale "
                "goes only with an fp8 weight)"
            )


def _weight_of(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    w = getattr(x, "weight", None)
    if isinstance(w, torch.Tensor):
        return w.detach()
    raise InputError(f"{name} must be a torch.Tensor or a module with .weight, got {type(x).__name__}")


def _plan(
    path: PathLike,
    *,
    target: Any,
    embed_tokens: Any,
    lm_head: Any,
    architecture: Optional[str],
    dtype: Optional[torch.dtype],
    config_overrides: Optional[Mapping[str, Any]],
    need_external: bool,
) -> _Plan:
    """Everything about the load that metadata can tell, with every problem collected."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"path must be a local directory (str or os.PathLike), got {type(path).__name__}")
    if architecture not in (None, "eagle3", "eagle2"):
        raise InputError(f"architecture must be 'eagle3', 'eagle2' or None (detect from the keys), got {architecture!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point
                                  and not is_8bit_float(dtype)):
        raise InputError(
            f"dtype must be a floating torch.dtype or None (keep the stored dtype), got {dtype!r}; it is the activation "
            "dtype - fp8 weights come from quantize='fp8' or from a head stored in fp8"
        )
    if config_overrides is not None and not isinstance(config_overrides, Mapping):
        raise InputError(f"config_overrides must be a dict of config.json fields, got {type(config_overrides).__name__}")
    root = Path(path)
    if root.is_file():  # a weights file or config.json: use its directory
        root = root.parent
    files = CheckpointFiles(root, role="head")
    cfg_path = root / "config.json"
    hf_config = _read_json(cfg_path, "head")
    if config_overrides:
        hf_config = {**hf_config, **dict(config_overrides)}
    where_cfg = f"head config {str(cfg_path)!r}"

    info = files.all_info()
    keys = set(info)
    try:
        detected: Optional[str] = detect_architecture(keys)
    except WeightsError:
        detected = None
    arch = architecture or detected
    hinted = [a for a in hf_config.get("architectures") or [] if isinstance(a, str)]
    if arch is None:
        if any("eagle3" in a.lower() for a in hinted):
            arch = "eagle3"
        else:
            raise WeightsError(
                f"cannot tell the architecture of the head in {files.source!r}: no 'midlayer.*' keys (eagle3) and no "
                f"'layers.N.*' keys (eagle2); keys found: {sorted(keys)[:12]}. Pass architecture='eagle3'|'eagle2'"
            )
    if architecture:
        note = f"forced by architecture={architecture!r}"
        if detected and detected != architecture:
            note += f"; the keys look like {detected!r}"
    else:
        note = "detected from the keys: " + ("midlayer.*" if arch == "eagle3" else "layers.N.*")
    plan = _Plan(path=root, hf_config=hf_config, files=files, architecture=arch, arch_note=note, dims=None, head_info=info)
    if files.ignored_layouts:
        plan.notes.append(f"head {str(root)!r}: using {files.source}; also present and ignored: {files.ignored_layouts}")
    plan.dims = dims = _dims_from_config(hf_config, arch, where_cfg, plan.errors)
    if dims is None:
        return plan

    # --- the head's own tensors against config.json -------------------------------------------
    expected = dims.expected_shapes()
    optional = {"embed_tokens.weight"}
    if arch == "eagle2":
        optional.add("lm_head.weight")  # eagle2 heads use the target's lm_head
    hint = f" ({note})" if architecture and detected and detected != architecture else ""
    for key, shape in expected.items():
        if key in info:
            t = info[key]
            if tuple(t.shape) != shape:
                plan.errors.append(
                    f"head file {str(t.file)!r}: tensor {key!r} has shape {_shape(t.shape)}, expected {_shape(shape)} "
                    f"(from {where_cfg}){hint}"
                )
            elif not t.dtype.is_floating_point:
                plan.errors.append(
                    f"head file {str(t.file)!r}: tensor {key!r} has dtype {_dt(t.dtype)}, expected a floating dtype"
                )
        elif key not in optional:
            bias_hint = ""
            if key == "fc.bias":
                said = "says" if "bias" in hf_config else "omits"
                bias_hint = (
                    f"; config.json {said} 'bias' (the public loader defaults to a biased fc) — if this head's fc has "
                    'no bias, set "bias": false'
                )
            plan.errors.append(
                f"head {files.source}: missing tensor {key!r} (expected shape {_shape(shape)} from {where_cfg}){hint}{bias_hint}"
            )
    if arch == "eagle2" and "lm_head.weight" in info:
        plan.strict_issues.append(
            f"head file {str(info['lm_head.weight'].file)!r}: unexpected tensor 'lm_head.weight' — eagle2 heads draft with "
            "the target's lm_head (pass target= or lm_head=); this tensor is ignored"
        )
    _check_fp8(plan, expected, info, arch)
    known = set(expected) | {"d2t", "t2d"}
    for key, t in info.items():
        if key in known or key.endswith(_IGNORED_SUFFIXES) or scale_owner(key) is not None:
            continue
        plan.strict_issues.append(
            f"head file {str(t.file)!r}: unexpected tensor {key!r} {_shape(t.shape)} for an {arch} head with this "
            f"config{hint} (strict=False ignores it)"
        )
    if arch == "eagle2":
        for key in ("d2t", "t2d"):
            if key in info:
                plan.strict_issues.append(
                    f"head file {str(info[key].file)!r}: unexpected tensor {key!r} — eagle2 heads have no vocabulary mapping"
                )

    # --- dtype: one floating dtype across the head unless dtype= casts (fp8 linears aside) ------
    floats = [(k, t) for k, t in info.items()
              if k in expected and t.dtype.is_floating_point and not is_8bit_float(t.dtype)]
    if floats:
        counts: dict[torch.dtype, int] = {}
        for _, t in floats:
            counts[t.dtype] = counts.get(t.dtype, 0) + 1
        plan.stored_dtype = max(counts, key=lambda d: counts[d])
        if dtype is None and len(counts) > 1:
            for k, t in floats:
                if t.dtype != plan.stored_dtype:
                    plan.errors.append(
                        f"head file {str(t.file)!r}: tensor {k!r} is {_dt(t.dtype)} but the rest of the head is "
                        f"{_dt(plan.stored_dtype)}; pass dtype= to cast every tensor to one dtype"
                    )

    # --- vocabulary mapping --------------------------------------------------------------------
    if arch == "eagle3":
        _check_vocab_mapping(plan, dims, info, files)

    # --- tensors the head does not ship --------------------------------------------------------
    _plan_externals(plan, dims, info, target=target, embed_tokens=embed_tokens, lm_head=lm_head, need=need_external)
    return plan


def _check_vocab_mapping(plan: _Plan, dims: HeadDims, info: dict[str, TensorInfo], files: CheckpointFiles) -> None:
    v, vt = dims.vocab_size, dims.target_vocab_size
    summary: dict[str, Any] = {"draft_vocab": v, "target_vocab": vt}
    plan.d2t_summary = summary
    d2t_info, t2d_info = info.get("d2t"), info.get("t2d")
    for key, t, shape in (("d2t", d2t_info, (v,)), ("t2d", t2d_info, (vt,))):
        if t is not None and tuple(t.shape) != shape:
            plan.errors.append(
                f"head file {str(t.file)!r}: tensor {key!r} has shape {_shape(t.shape)}, expected {_shape(shape)} "
                f"({'draft_vocab_size' if key == 'd2t' else 'vocab_size'} from config.json)"
            )
            return
    if d2t_info is not None and (d2t_info.dtype.is_floating_point or d2t_info.dtype == torch.bool):
        plan.errors.append(
            f"head file {str(d2t_info.file)!r}: tensor 'd2t' has dtype {_dt(d2t_info.dtype)}, expected int64 offsets"
        )
        return
    if v == vt:
        summary["mapping"] = "identity (draft vocabulary = target vocabulary)"
        if d2t_info is not None:
            d2t = files.load("d2t")
            if bool((d2t != 0).any()):
                plan.notes.append(
                    f"head file {str(d2t_info.file)!r}: d2t is ignored because draft_vocab_size == vocab_size == {v} "
                    "(as in the public code)"
                )
        return
    if d2t_info is None:
        plan.errors.append(
            f"head {files.source}: missing tensor 'd2t' (expected shape [{v}], int64 offsets): draft_vocab_size={v} < "
            f"vocab_size={vt} needs the draft->target mapping"
        )
        return
    where = f"head file {str(d2t_info.file)!r}: tensor 'd2t'"
    d2t = files.load("d2t").to(torch.int64).clone()
    ar = torch.arange(v, dtype=torch.int64)
    targets = ar + d2t
    in_range_abs = bool(((d2t >= 0) & (d2t < vt)).all()) and int(torch.unique(d2t).numel()) == v
    absolute_hint = (
        f" It looks like ABSOLUTE target ids (every value lies in [0, {vt}) and they are distinct); the published "
        f"format stores OFFSETS (target_id = draft_id + d2t[draft_id]): convert with d2t - torch.arange({v})"
        if in_range_abs
        else ""
    )
    summary.update(
        mapping="d2t offsets",
        offset_min=int(d2t.min()),
        offset_max=int(d2t.max()),
        target_min=int(targets.min()),
        target_max=int(targets.max()),
        monotone=bool((targets[1:] > targets[:-1]).all()) if v > 1 else True,
    )
    if not bool(d2t.any()):
        summary["mapping"] = "d2t all zeros"
        plan.strict_issues.append(
            f"{where} is all zeros but draft_vocab_size={v} < vocab_size={vt}: every draft id j would map to target "
            f"id j, i.e. only the first {v} target ids could ever be drafted. That is the unfilled buffer of a head "
            "saved before its vocabulary mapping was set (or with the mapping lost); the published format stores "
            "offsets target_id = draft_id + d2t[draft_id]"
        )
        plan.d2t = d2t
        return
    lo, hi = int(targets.min()), int(targets.max())
    if lo < 0 or hi >= vt:
        bad = int(((targets < 0) | (targets >= vt)).nonzero()[0, 0])
        plan.errors.append(
            f"{where} maps draft id {bad} to target id {int(targets[bad])}, outside [0, {vt}) "
            f"(target ids span [{lo}, {hi}]).{absolute_hint}"
        )
        return
    n_unique = int(torch.unique(targets).numel())
    if n_unique != v:
        plan.strict_issues.append(
            f"{where} maps {v} draft ids onto only {n_unique} distinct target ids (two draft ids share a target).{absolute_hint}"
        )
    if t2d_info is not None:
        t2d = files.load("t2d")
        if t2d.dtype != torch.bool:
            t2d = t2d != 0
        if bool(t2d.any()):
            covered = t2d.nonzero().flatten()
            mine = torch.zeros(vt, dtype=torch.bool)
            mine[targets] = True
            if torch.equal(mine, t2d):
                summary["t2d"] = "consistent with d2t"
            elif in_range_abs and covered.numel() == v and torch.equal(covered, torch.sort(d2t).values):
                plan.errors.append(
                    f"{where} holds ABSOLUTE target ids: its values are exactly the target ids marked in 't2d', so "
                    f"draft id j would map to j + d2t[j]. The published format stores OFFSETS: convert with "
                    f"d2t - torch.arange({v})"
                )
                return
            else:
                differ = int((mine ^ t2d).sum())
                plan.strict_issues.append(
                    f"{where} disagrees with 't2d' ({str(t2d_info.file)!r}): {differ} target ids are marked in one and "
                    "not the other (t2d[target_id] should be True exactly for target_id = j + d2t[j])"
                )
                summary["t2d"] = f"DISAGREES with d2t on {differ} ids"
        else:
            summary["t2d"] = "all false (unused)"
    else:
        summary["t2d"] = "absent"
    steps = d2t[1:] - d2t[:-1]
    if (
        t2d_info is None or summary.get("t2d") == "all false (unused)"
    ) and v > 1 and bool((steps >= 1).all()) and v * (v - 1) / vt >= 8:
        plan.notes.append(
            f"{where} increases by at least 1 at every step; real offsets stay flat wherever the draft vocabulary "
            f"holds consecutive target ids, so this looks like ABSOLUTE target ids. The published format stores "
            f"OFFSETS (target_id = draft_id + d2t[draft_id]); if yours are absolute, convert with d2t - torch.arange({v})"
        )
    plan.d2t = d2t


def _target_config(directory: Path) -> dict:
    p = directory / "config.json"
    if not p.is_file():
        return {}
    try:
        data = _read_json_file(p, "target config")
    except WeightsError:
        return {}
    return data if isinstance(data, dict) else {}


def _plan_externals(
    plan: _Plan, dims: HeadDims, info: dict[str, TensorInfo], *, target: Any, embed_tokens: Any, lm_head: Any, need: bool
) -> None:
    arch = plan.architecture
    exp_emb = (dims.target_vocab_size, dims.hidden_size)
    exp_head = (dims.target_vocab_size, dims.hidden_size)
    want_emb = embed_tokens is None and "embed_tokens.weight" not in info
    want_head = arch == "eagle2" and lm_head is None
    if arch == "eagle3" and lm_head is not None:
        raise InputError("lm_head= is for eagle2 heads (they use the target's lm_head); eagle3 heads ship their own")

    tcfg: dict = {}
    tfiles: Optional[CheckpointFiles] = None
    module = None
    if target is not None:
        if isinstance(target, (str, os.PathLike)):
            tdir = Path(target)
            if tdir.is_file():
                tdir = tdir.parent
            tcfg = _target_config(tdir)
            if want_emb or want_head:
                tfiles = CheckpointFiles(tdir, role="target")
        elif isinstance(target, torch.nn.Module):
            module = target
            c = getattr(target, "config", None)
            tcfg = c.to_dict() if hasattr(c, "to_dict") else dict(vars(c)) if c is not None else {}
        else:
            raise InputError(
                f"target must be a local target checkpoint directory or a loaded Hugging Face model, got {type(target).__name__}"
            )
        # The target's own config, when known, must agree with the head's.
        th = tcfg.get("hidden_size")
        if isinstance(th, int) and th != dims.target_hidden_size:
            what = "3 x target_hidden_size = F" if arch == "eagle3" else "hidden_size"
            plan.errors.append(
                f"head/target hidden-size mismatch: the target's config says hidden_size={th}, but the head expects "
                f"{dims.target_hidden_size} (its {what}={dims.feature_size if arch == 'eagle3' else dims.hidden_size}, "
                "from config.json) — is this the head's target model?"
            )
        tv = tcfg.get("vocab_size")
        if isinstance(tv, int) and tv != dims.target_vocab_size:
            plan.errors.append(
                f"head/target vocabulary mismatch: the target's config says vocab_size={tv}, the head's config.json "
                f"vocab_size={dims.target_vocab_size} — is this the head's target model?"
            )

    def from_tensor(x: Any, name: str) -> _External:
        t = _weight_of(x, name)
        return _External(f"{name}= argument", tuple(t.shape), t.dtype, lambda: t, f"{name}=", shared=True)

    def from_files(kind: str) -> Optional[_External]:
        assert tfiles is not None
        key = tfiles.find("lm_head.weight", suffix=".lm_head.weight") if kind == "head" else None
        if kind == "embed" or (key is None and tcfg.get("tie_word_embeddings") is True):
            key = tfiles.find("model.embed_tokens.weight", "embed_tokens.weight", suffix=".embed_tokens.weight")
        if key is None:
            extra = "" if kind == "embed" else " (and its config.json does not set tie_word_embeddings=true)"
            want = "model.embed_tokens.weight" if kind == "embed" else "lm_head.weight"
            plan.errors.append(f"target {tfiles.source}: no {want!r} tensor{extra}")
            return None
        t = tfiles.info(key)
        files = tfiles
        return _External(f"target {str(t.file)!r} [{key}]", t.shape, t.dtype, lambda: files.load(key), f"target file {str(t.file)!r}: tensor {key!r}")

    def from_module(kind: str) -> Optional[_External]:
        assert module is not None
        getter = "get_input_embeddings" if kind == "embed" else "get_output_embeddings"
        fn = getattr(module, getter, None)
        mod = fn() if callable(fn) else None
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor):
            plan.errors.append(f"target model {type(module).__name__}.{getter}() gives no weight tensor")
            return None
        w = w.detach()
        name = f"target model {type(module).__name__}.{getter}()"
        return _External(name, tuple(w.shape), w.dtype, lambda: w, f"{name}.weight", shared=True)

    def resolve(kind: str, explicit: Any, want: bool) -> Optional[_External]:
        name = "embed_tokens" if kind == "embed" else "lm_head"
        if explicit is not None:
            return from_tensor(explicit, name)
        if not want:
            return None
        if tfiles is not None:
            return from_files(kind)
        if module is not None:
            return from_module(kind)
        return None

    emb = resolve("embed", embed_tokens, want_emb)
    if emb is None and "embed_tokens.weight" in info:
        plan.embedding_source = f"head {str(info['embed_tokens.weight'].file)!r}"
        if target is not None:  # as in the public loader, the head's own tensor wins over the target's
            plan.embedding_source += " (the head's own; the target's is not used)"
    elif emb is not None:
        plan.embedding, plan.embedding_source = emb, emb.source
    elif need:
        plan.errors.append(
            f"the {arch} head in {str(plan.path)!r} does not ship 'embed_tokens.weight' (expected shape {_shape(exp_emb)}): "
            "it comes from the target model — pass target=<target checkpoint dir or loaded model> or embed_tokens="
        )
    else:
        plan.embedding_source = "not in the head; from the target model (not given)"
    if arch == "eagle2":
        head = resolve("head", lm_head, want_head)
        if head is not None:
            plan.lm_head, plan.lm_head_source = head, head.source
        elif need:
            plan.errors.append(
                f"the eagle2 head in {str(plan.path)!r} drafts with the target's lm_head (expected shape {_shape(exp_head)}): "
                "pass target=<target checkpoint dir or loaded model> or lm_head="
            )
        else:
            plan.lm_head_source = "the target's lm_head (not given)"
    else:
        plan.lm_head_source = f"head {str(info['lm_head.weight'].file)!r}" if "lm_head.weight" in info else "missing"

    for ext, expect, label in ((plan.embedding, exp_emb, "embedding"), (plan.lm_head, exp_head, "lm_head")):
        if ext is None:
            continue
        if tuple(ext.shape) != expect:
            rows, cols = (ext.shape + (None, None))[:2]
            why = []
            if len(ext.shape) == 2 and cols != expect[1]:
                why.append(f"hidden-size mismatch: the head's hidden_size={dims.hidden_size}")
            if len(ext.shape) == 2 and rows != expect[0]:
                why.append(f"vocabulary mismatch: the head's config.json vocab_size={dims.target_vocab_size}")
            plan.errors.append(
                f"{ext.where} ({label}) has shape {_shape(ext.shape)}, expected {_shape(expect)}"
                + (f" — head/target {'; '.join(why)}" if why else "")
            )
        elif not ext.dtype.is_floating_point or is_8bit_float(ext.dtype):
            plan.errors.append(
                f"{ext.where} ({label}) has dtype {_dt(ext.dtype)}, expected a floating activation dtype "
                "(float32, float16 or bfloat16)"
            )
