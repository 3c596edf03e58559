"""Shared test fixtures.

On a machine without an NVIDIA GPU, Triton kernels run under the interpreter: the variable
must be set before anything imports triton, hence here, at the top of conftest.
"""

import os

if not os.path.exists("/dev/nvidia0") and not os.environ.get("FRONTIER_NO_TRITON_INTERPRET"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import frontier  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def _slow_case(item) -> bool:
    """Whether a ``slow_case(**params)`` mark of ``item`` matches its parameters: every named
    parameter (a test parameter or a parametrized fixture such as ``backend_name``) equal to the
    given value, or in it where the value is a list."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for mark in item.iter_markers("slow_case"):
        if all(k in params and (params[k] in v if isinstance(v, list) else params[k] == v)
               for k, v in mark.kwargs.items()):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks added here
def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if _slow_case(item):
            item.add_marker(pytest.mark.slow)


def registered_backends() -> list[str]:
    return frontier.available_backends()


def runnable_backends() -> list[str]:
    """Registered backends that can run on this machine (CPU inputs unless a GPU is present)."""
    out = []
    for name in frontier.available_backends():
        try:
            ok, _ = frontier.get_backend(name).availability()
        except frontier.FrontierError:
            ok = False
        if ok:
            out.append(name)
    return out


def backend_device(name: str) -> torch.device:
    """Where a test puts a backend's inputs: the CPU where the backend takes CPU tensors, else
    the GPU (triton compiled for a GPU takes CUDA tensors only; under the interpreter it lists
    the CPU)."""
    return torch.device("cpu" if "cpu" in frontier.get_backend(name).devices else "cuda")


@pytest.fixture(params=runnable_backends())
def backend_name(request):
    """Every backend that can run here; tests draw weights only for those that need them."""
    return request.param
