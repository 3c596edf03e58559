"""frontier: the EAGLE-2/EAGLE-3 speculative-decoding draft tree, fast, behind one call.

    from frontier import FrontierConfig, frontier_generate
    cfg = FrontierConfig(total_token=60, depth=5, top_k=10, vocab_size=32000, hidden_size=4096)
    fr = frontier_generate(cfg, features, backend="stub")
"""

from .api import DraftRequest, frontier_generate
from .batch import BatchDraftCache, frontier_generate_batch
from .cache import DraftCache
from .config import FrontierConfig
from .drafter import Drafter, DrafterBuffers, DrafterOutputs
from .eagle_patch import patch_ea_model_with_triton_drafter, unpatch_ea_model
from .errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    CacheError,
    ConfigError,
    FrontierError,
    InputError,
    InvariantError,
    KernelError,
    NonFiniteError,
    RegistryError,
    WeightsError,
)
from .generation import (
    BatchGenerationResult,
    BatchGenerationStats,
    GenerationResult,
    GenerationStats,
    SpeculativeGenerator,
    generate,
)
from .loading import DraftHead, load_draft_head
from .registry import Backend, available_backends, backend_report, get_backend, register_backend, unregister_backend
from .result import Frontier
from .weights import DraftWeights, LayerWeights

__version__ = "0.1.0"

__all__ = [
    "generate",
    "SpeculativeGenerator",
    "GenerationResult",
    "GenerationStats",
    "BatchGenerationResult",
    "BatchGenerationStats",
    "patch_ea_model_with_triton_drafter",
    "unpatch_ea_model",
    "FrontierConfig",
    "Frontier",
    "frontier_generate",
    "Drafter",
    "DrafterBuffers",
    "DrafterOutputs",
    "frontier_generate_batch",
    "BatchDraftCache",
    "DraftRequest",
    "DraftCache",
    "DraftWeights",
    "DraftHead",
    "load_draft_head",
    "LayerWeights",
    "Backend",
    "register_backend",
    "unregister_backend",
    "get_backend",
    "available_backends",
    "backend_report",
    "FrontierError",
    "ConfigError",
    "InputError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "RegistryError",
    "WeightsError",
    "CacheError",
    "InvariantError",
    "NonFiniteError",
    "KernelError",
    "__version__",
]
