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


def _patch_the_language_once_per_launch() -> None:
    """Under TRITON_INTERPRET=1 each call of a device function (a ``@triton.jit`` function called
    from a kernel) patches ``triton.language`` again (``interpreter._patch_lang``), although the
    launch running it (``GridExecutor``) has patched the same modules for its whole grid: about a
    third of the interpreted kernels' time in these tests. Here, within a launch, a device function
    whose language modules have been patched in that launch already skips the patch; everything
    else (and any Triton whose interpreter is laid out otherwise) runs as it comes. The patch swaps
    the language's builtins for the interpreter's, which are then swapped already, so what the
    kernels compute is unchanged (an unswapped builtin would raise, not compute otherwise)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    real_patch = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if real_patch is None or executor is None or getattr(real_patch, "once_per_launch", False):
        return
    real_launch = executor.__call__
    state = {"launch": False, "langs": None}  # inside a launch; the modules patched in it so far

    class _Unpatched:
        def restore(self):
            pass

    def langs(fn):
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def patch_lang(fn):
        mine = langs(fn)
        if state["langs"] is not None and mine <= state["langs"]:
            return _Unpatched()
        scope = real_patch(fn)
        if state["launch"]:  # the launch's own patch (undone when it ends) or a device function's (kept)
            state["langs"] = mine | (state["langs"] or set())
        return scope

    def launch(self, *args, **kwargs):
        outer = dict(state)
        state.update(launch=True, langs=None)
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            state.update(outer)

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang
    executor.__call__ = launch


def _sum_fp16_dots_in_k_order() -> None:
    """Under TRITON_INTERPRET=1 ``tl.dot`` is ``np.matmul`` in fp32, and the BLAS behind it sums a
    product and its transpose in different orders on some CPUs (on an AVX2 machine, ``x @ w^T`` and
    ``(w @ x^T)^T`` of fp16 tiles differ in the last bit of a quarter to a third of their sums).
    The fp8 streams' swapped dot (``stream._w_dot``) would then not give the bits of the unswapped
    dot of the dequantized weights, which the fp8 tests check, and the tests would pass or fail
    with the CPU. Products of two fp16 values are exact in fp32, so here an fp16 dot is summed over
    k in order, one fp32 rounding per term - the same sums for a dot and its transpose on every
    CPU. Every other dot runs as it comes (fp32 dots keep the BLAS sums that torch's CPU matmul
    makes)."""
    try:
        import inspect

        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    real_dot = getattr(builder, "create_dot", None)
    if real_dot is None or handle is None or getattr(real_dot, "k_order", False):
        return
    if list(inspect.signature(real_dot).parameters) != ["self", "a", "b", "d", "input_precision",
                                                         "max_num_imprecise_acc"]:
        return  # an interpreter laid out otherwise: its dots run as they come

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not (a.data.dtype == b.data.dtype == np.float16 and d.data.dtype == np.float32):
            return real_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        x, w = a.data.astype(np.float32), b.data.astype(np.float32)  # [..., m, k], [..., k, n]
        acc = x[..., :, 0, None] * w[..., None, 0, :]  # the exact products, added over k in order
        for i in range(1, x.shape[-1]):
            acc += x[..., :, i, None] * w[..., None, i, :]
        return handle(acc + d.data, d.dtype.scalar)

    create_dot.k_order = True
    builder.create_dot = create_dot


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_the_language_once_per_launch()
    _sum_fp16_dots_in_k_order()


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


@pytest.fixture
def one_thread():
    """One torch thread for the test (tiny heads: threads only add overhead and vary timings)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(params=runnable_backends())
def backend_name(request):
    """Every backend that can run here; tests draw weights only for those that need them."""
    return request.param
