"""The one GPU condition (tests/conftest.py): a test marked `gpu` skips by itself where CUDA is absent, except a
Triton kernel's test (gpu(triton_interpreter=True)) under Triton's interpreter."""

import pytest
from conftest import gpu_skip_reason

GPU = pytest.mark.gpu.mark
KERNEL = pytest.mark.gpu(triton_interpreter=True).mark


@pytest.mark.parametrize("marker, cuda, interpreter, skips", [
    pytest.param(GPU, True, False, False, id="gpu-cuda"),
    pytest.param(GPU, False, False, True, id="gpu-no-cuda"),
    pytest.param(GPU, False, True, True, id="gpu-interpreter"),  # the interpreter runs Triton kernels, not CUDA
    pytest.param(KERNEL, True, False, False, id="kernel-cuda"),
    pytest.param(KERNEL, False, False, True, id="kernel-no-cuda"),
    pytest.param(KERNEL, False, True, False, id="kernel-interpreter"),
])
def test_a_gpu_test_skips_exactly_where_it_cannot_run(marker, cuda, interpreter, skips):
    why = gpu_skip_reason(marker, cuda, interpreter)
    assert (why == "needs a CUDA device") if skips else why is None

