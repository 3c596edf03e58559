"""DraftCache: preallocated draft-layer K/V, its committed length, and every check on them."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from frontier import CacheError, ConfigError, FrontierConfig
from frontier.cache import DEFAULT_MAX_LENGTH, DraftCache, default_max_length

CFG = FrontierConfig(
    total_token=4, depth=1, top_k=2, vocab_size=10, hidden_size=8,
    num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
)  # head_dim 4, one kv head, one layer


def small(max_length: int = 8, length: int = 0, layers: int = 2, dtype=torch.float32) -> DraftCache:
    cache = DraftCache(layers, 3, 4, max_length, dtype=dtype, device="cpu")  # k, v: [layers, 3, max_length, 4]
    cache.length = length
    return cache


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


# ----------------------------------------------------------------------------------------------
# Construction
# ----------------------------------------------------------------------------------------------
def test_default_max_length_is_4096_or_twice_the_context():
    assert DEFAULT_MAX_LENGTH == 4096
    assert default_max_length(0) == 4096
    assert default_max_length(2048) == 4096
    assert default_max_length(2049) == 4098
    assert default_max_length(5000) == 10000


def test_constructor_allocates_zeroed_storage():
    cache = DraftCache(2, 3, 4, 8, dtype=torch.float16, device="cpu")
    assert cache.k.shape == (2, 3, 8, 4) and cache.v.shape == (2, 3, 8, 4)
    assert cache.k.dtype == torch.float16 and cache.v.dtype == torch.float16
    assert not cache.k.any() and not cache.v.any()
    assert cache.k.data_ptr() != cache.v.data_ptr()
    assert cache.length == 0 and cache.max_length == 8 and cache.num_layers == 2
    assert cache.dtype == torch.float16 and cache.device == torch.device("cpu")
    assert DraftCache(1, 1, 2, 1, dtype=torch.float32, device="meta").device == torch.device("meta")


@pytest.mark.parametrize("max_length", [0, -3])
def test_constructor_refuses_a_cache_without_rows(max_length):
    with pytest.raises(CacheError, match=exactly(f"max_length must be positive, got max_length={max_length}")):
        DraftCache(1, 1, 2, max_length, dtype=torch.float32, device="cpu")


def test_for_config_takes_the_layer_dims():
    cache = DraftCache.for_config(CFG, dtype=torch.float32, device="cpu")
    assert cache.k.shape == (1, 1, DEFAULT_MAX_LENGTH, 4) and cache.length == 0
    cache = DraftCache.for_config(CFG, max_length=16, dtype=torch.bfloat16, device="cpu")
    assert cache.k.shape == (1, 1, 16, 4) and cache.dtype == torch.bfloat16
    assert DraftCache.for_config(CFG, max_length=2, dtype=torch.float32, device="meta").device == torch.device("meta")
    tree_only = FrontierConfig(total_token=4, depth=1, top_k=2, vocab_size=10, hidden_size=8)
    with pytest.raises(ConfigError, match=r"^DraftCache runs the draft layer and needs num_attention_heads, intermediate_size"):
        DraftCache.for_config(tree_only, dtype=torch.float32, device="cpu")


def test_fresh_sizes_for_the_context():
    cache = DraftCache.fresh(CFG, context_length=3000, dtype=torch.float32, device="cpu")
    assert cache.max_length == 6000 and cache.length == 0
    assert DraftCache.fresh(CFG, context_length=10, dtype=torch.float32, device="cpu").max_length == 4096
    cache = DraftCache.fresh(CFG, context_length=10, dtype=torch.float32, device="cpu", max_length=10)
    assert cache.max_length == 10  # exactly full after the first call: allowed
    cache = DraftCache.fresh(CFG, context_length=4, dtype=torch.float16, device="meta", max_length=6)
    assert cache.dtype == torch.float16 and cache.device == torch.device("meta") and cache.k.shape == (1, 1, 6, 4)
    with pytest.raises(CacheError, match=exactly(
        "draft cache overflow: 0 cached + 11 new rows > max_length=10; "
        "start a larger cache (cache_max_length=...) or truncate it"
    )):
        DraftCache.fresh(CFG, context_length=11, dtype=torch.float32, device="cpu", max_length=10)


# ----------------------------------------------------------------------------------------------
# from_tensors
# ----------------------------------------------------------------------------------------------
def test_from_tensors_wraps_the_storage_itself():
    k, v = torch.randn(2, 3, 8, 4), torch.randn(2, 3, 8, 4)
    cache = DraftCache.from_tensors(k, v, 5)
    assert cache.k is k and cache.v is v and cache.length == 5 and cache.max_length == 8
    assert DraftCache.from_tensors(k, v).length == 0
    assert DraftCache.from_tensors(k, v, 8).length == 8
    assert DraftCache.from_tensors(k[:, :, :1], v[:, :, :1]).max_length == 1


def test_from_tensors_checks():
    k = torch.zeros(2, 3, 8, 4)
    with pytest.raises(CacheError, match=exactly("k and v must be torch.Tensors, got list and Tensor")):
        DraftCache.from_tensors([0], k)
    with pytest.raises(CacheError, match=exactly("k and v must be torch.Tensors, got Tensor and NoneType")):
        DraftCache.from_tensors(k, None)
    with pytest.raises(CacheError, match=exactly(
        "k and v must both be [layers, kv heads, max_length, head_dim], got [3, 8, 4] and [3, 8, 4]"
    )):
        DraftCache.from_tensors(k[0], k[0])
    with pytest.raises(CacheError, match=exactly(
        "k and v must both be [layers, kv heads, max_length, head_dim], got [2, 3, 8, 4] and [2, 3, 7, 4]"
    )):
        DraftCache.from_tensors(k, torch.zeros(2, 3, 7, 4))
    with pytest.raises(CacheError, match=exactly(
        "k and v must share dtype and device, got torch.float32 on cpu and torch.float16 on cpu"
    )):
        DraftCache.from_tensors(k, k.half())
    with pytest.raises(CacheError, match=exactly(
        "k and v must share dtype and device, got torch.float32 on cpu and torch.float32 on meta"
    )):
        DraftCache.from_tensors(k, k.to("meta"))
    with pytest.raises(CacheError, match=exactly(
        "k and v must hold at least one row (max_length >= 1), got shape [2, 3, 0, 4]"
    )):
        DraftCache.from_tensors(k[:, :, :0], k[:, :, :0])
    with pytest.raises(CacheError, match=exactly("length must lie in [0, max_length=8], got length=9")):
        DraftCache.from_tensors(k, k.clone(), 9)
    with pytest.raises(CacheError, match=exactly("length must be an int in [0, max_length=8], got 2.0")):
        DraftCache.from_tensors(k, k.clone(), 2.0)


# ----------------------------------------------------------------------------------------------
# length
# ----------------------------------------------------------------------------------------------
def test_length_accepts_ints_in_range():
    cache = small()
    for value in (0, 1, 7, 8):
        cache.length = value
        assert cache.length == value and type(cache.length) is int
    cache.length = np.int64(3)
    assert cache.length == 3 and type(cache.length) is int
    cache.length = torch.tensor(4)
    assert cache.length == 4 and type(cache.length) is int


@pytest.mark.parametrize("value", [-1, 9, 100])
def test_length_out_of_range(value):
    cache = small(length=2)
    with pytest.raises(CacheError, match=exactly(f"length must lie in [0, max_length=8], got length={value}")):
        cache.length = value
    assert cache.length == 2


@pytest.mark.parametrize("value", [True, False, 2.0, "3", None])
def test_length_must_be_an_int(value):
    cache = small(length=2)
    with pytest.raises(CacheError, match=exactly(f"length must be an int in [0, max_length=8], got {value!r}")):
        cache.length = value
    assert cache.length == 2


def test_storage_is_read_only():
    cache = small()
    with pytest.raises(AttributeError):
        cache.k = torch.zeros(2, 3, 8, 4)
    with pytest.raises(AttributeError):
        cache.v = torch.zeros(2, 3, 8, 4)


# ----------------------------------------------------------------------------------------------
# check_compatible / check_room
# ----------------------------------------------------------------------------------------------
def test_check_compatible():
    cache = DraftCache.for_config(CFG, max_length=8, dtype=torch.float32, device="cpu")
    cache.check_compatible(CFG, torch.float32, torch.device("cpu"))
    with pytest.raises(CacheError, match=exactly("cache dtype is torch.float32, the weights are torch.float16")):
        cache.check_compatible(CFG, torch.float16, torch.device("cpu"))
    with pytest.raises(CacheError, match=exactly("cache is on cpu, the weights on meta")):
        cache.check_compatible(CFG, torch.float32, torch.device("meta"))


@pytest.mark.parametrize("shape,have", [
    ((2, 1, 8, 4), (2, 1, 4)),  # layers
    ((1, 2, 8, 4), (1, 2, 4)),  # kv heads
    ((1, 1, 8, 6), (1, 1, 6)),  # head dim
])
def test_check_compatible_names_the_mismatched_dims(shape, have):
    cache = DraftCache.from_tensors(torch.zeros(shape), torch.zeros(shape))
    with pytest.raises(CacheError, match=exactly(f"cache has (layers, kv heads, head dim) = {have}, the config needs (1, 1, 4)")):
        cache.check_compatible(CFG, torch.float32, torch.device("cpu"))


def test_check_compatible_refuses_storage_changed_in_place():
    cache = DraftCache.for_config(CFG, max_length=8, dtype=torch.float32, device="cpu")
    cache.length = 6
    cache.k.resize_(1, 1, 5, 4)
    cache.v.resize_(1, 1, 5, 4)
    with pytest.raises(CacheError, match=exactly("cache storage is inconsistent: k [1, 1, 5, 4], v [1, 1, 5, 4], length 6")):
        cache.check_compatible(CFG, torch.float32, torch.device("cpu"))
    cache = DraftCache.for_config(CFG, max_length=8, dtype=torch.float32, device="cpu")
    cache.v.resize_(1, 1, 7, 4)
    with pytest.raises(CacheError, match=exactly("cache storage is inconsistent: k [1, 1, 8, 4], v [1, 1, 7, 4], length 0")):
        cache.check_compatible(CFG, torch.float32, torch.device("cpu"))
    cache = DraftCache.for_config(CFG, max_length=8, dtype=torch.float32, device="cpu")
    cache.k.resize_(1, 8, 4)
    cache.v.resize_(1, 8, 4)
    with pytest.raises(CacheError, match=exactly("cache storage is inconsistent: k [1, 8, 4], v [1, 8, 4], length 0")):
        cache.check_compatible(CFG, torch.float32, torch.device("cpu"))
    cache = DraftCache.for_config(CFG, max_length=8, dtype=torch.float32, device="cpu")
    cache.length = 5
    cache.k.resize_(1, 1, 5, 4)
    cache.v.resize_(1, 1, 5, 4)
    cache.check_compatible(CFG, torch.float32, torch.device("cpu"))  # exactly full: still consistent


def test_check_room_allows_filling_to_max_length_exactly():
    cache = small(length=5)
    cache.check_room(0)
    cache.check_room(3)
    with pytest.raises(CacheError, match=exactly(
        "draft cache overflow: 5 cached + 4 new rows > max_length=8; start a larger cache (cache_max_length=...) or truncate it"
    )):
        cache.check_room(4)


# ----------------------------------------------------------------------------------------------
# write / keys / values / commit / truncate
# ----------------------------------------------------------------------------------------------
def test_write_then_read_back():
    cache = small(length=2)
    k, v = torch.randn(3, 4, 4), torch.randn(3, 4, 4)
    cache.write(1, 2, k, v)
    assert torch.equal(cache.k[1, :, 2:6], k) and torch.equal(cache.v[1, :, 2:6], v)
    assert not cache.k[0].any() and not cache.v[0].any()  # the other layer untouched
    assert not cache.k[1, :, :2].any() and not cache.k[1, :, 6:].any()
    assert cache.length == 2  # written, not committed
    assert cache.keys(1).shape == (3, 2, 4) and cache.values(1).shape == (3, 2, 4)
    assert torch.equal(cache.keys(1, 6)[:, 2:], k) and torch.equal(cache.values(1, 6)[:, 2:], v)
    cache.commit(6)
    assert torch.equal(cache.keys(1)[:, 2:], k) and torch.equal(cache.values(1)[:, 2:], v)
    assert cache.keys(0, 0).shape == (3, 0, 4)


def test_write_up_to_max_length_exactly_and_no_further():
    cache = small(length=4)
    cache.write(0, 4, torch.ones(3, 4, 4), torch.ones(3, 4, 4))  # rows 4..7 of 8
    assert cache.k[0, :, 7].eq(1).all()
    with pytest.raises(CacheError, match=exactly("draft cache overflow: rows up to 9 > max_length=8")):
        cache.write(0, 5, torch.ones(3, 4, 4), torch.ones(3, 4, 4))


def test_write_refuses_committed_rows():
    cache = small(length=4)
    with pytest.raises(CacheError, match=exactly("refusing to overwrite committed cache rows (3 < length 4)")):
        cache.write(0, 3, torch.ones(3, 1, 4), torch.ones(3, 1, 4))
    assert not cache.k.any()


def test_commit():
    cache = small(length=3)
    cache.commit(3)
    assert cache.length == 3
    cache.commit(8)
    assert cache.length == 8 and type(cache.length) is int
    cache = small(length=3)
    cache.commit(np.int32(5))
    assert cache.length == 5 and type(cache.length) is int
    with pytest.raises(CacheError, match=exactly("cannot commit length 4 (length 5, max 8)")):
        cache.commit(4)
    with pytest.raises(CacheError, match=exactly("cannot commit length 9 (length 5, max 8)")):
        cache.commit(9)
    with pytest.raises(CacheError, match=exactly("new_length must be an int in [0, max_length=8], got 6.0")):
        cache.commit(6.0)
    with pytest.raises(CacheError, match=exactly("new_length must be an int in [0, max_length=8], got True")):
        cache.commit(True)
    assert cache.length == 5


def test_truncate():
    cache = small(length=6)
    cache.truncate(6)
    assert cache.length == 6
    cache.truncate(2)
    assert cache.length == 2
    cache.truncate(torch.tensor(1))
    assert cache.length == 1 and type(cache.length) is int
    cache.truncate(0)
    assert cache.length == 0
    cache = small(length=5)
    with pytest.raises(CacheError, match=exactly("cannot truncate to 6: the cache holds 5 rows")):
        cache.truncate(6)
    with pytest.raises(CacheError, match=exactly("cannot truncate to -1: the cache holds 5 rows")):
        cache.truncate(-1)
    with pytest.raises(CacheError, match=exactly("length must be an int in [0, max_length=8], got '2'")):
        cache.truncate("2")
    assert cache.length == 5


def test_clone_is_independent():
    cache = small(length=3, dtype=torch.float64)
    cache.write(0, 3, torch.ones(3, 2, 4, dtype=torch.float64), torch.full((3, 2, 4), 2.0, dtype=torch.float64))
    copy = cache.clone()
    assert isinstance(copy, DraftCache) and copy.length == 3 and copy.max_length == 8 and copy.dtype == torch.float64
    assert torch.equal(copy.k, cache.k) and torch.equal(copy.v, cache.v)
    copy.k.zero_()
    copy.commit(5)
    assert cache.k[0, :, 3:5].eq(1).all() and cache.length == 3
    assert cache.v[0, :, 3:5].eq(2).all() and copy.v.data_ptr() != cache.v.data_ptr()


def test_nbytes_and_repr():
    cache = DraftCache(2, 3, 4, 8, dtype=torch.float16, device="cpu")
    assert cache.nbytes() == 2 * (2 * 3 * 8 * 4) * 2
    cache.length = 5
    assert repr(cache) == (
        "DraftCache(length=5, max_length=8, layers=2, kv_heads=3, head_dim=4, dtype=torch.float16, device=cpu)"
    )
