"""The one GPU condition (tests/conftest.py): a test marked `gpu` skips by itself where CUDA is absent, except a
Triton kernel's test (gpu(triton_interpreter=True)) under Triton's interpreter; a test of a Triton kernel
(gpu(triton=True), and every gpu(triton_interpreter=True)) skips where Triton is absent."""

import pytest
from conftest import gpu_skip_reason

GPU = pytest.mark.gpu.mark
KERNEL = pytest.mark.gpu(triton_interpreter=True).mark
TRITON = pytest.mark.gpu(triton=True).mark


@pytest.mark.parametrize("marker, cuda, interpreter, skips", [
    pytest.param(GPU, True, False, False, id="gpu-cuda"),
    pytest.param(GPU, False, False, True, id="gpu-no-cuda"),
    pytest.param(GPU, False, True, True, id="gpu-interpreter"),  # the interpreter runs Triton kernels, not CUDA
    pytest.param(KERNEL, True, False, False, id="kernel-cuda"),
    pytest.param(KERNEL, False, False, True, id="kernel-no-cuda"),
    pytest.param(KERNEL, False, True, False, id="kernel-interpreter"),
    pytest.param(TRITON, True, False, False, id="triton-cuda"),
    pytest.param(TRITON, False, False, True, id="triton-no-cuda"),
    pytest.param(TRITON, False, True, True, id="triton-interpreter"),  # not gpu(triton_interpreter=True)
])
def test_a_gpu_test_skips_exactly_where_it_cannot_run(marker, cuda, interpreter, skips):
    why = gpu_skip_reason(marker, cuda, interpreter, triton=True)
    assert (why == "needs a CUDA device") if skips else why is None


@pytest.mark.parametrize("marker, cuda, interpreter, why", [
    pytest.param(GPU, True, False, None, id="gpu-cuda"),
    pytest.param(KERNEL, True, False, "needs Triton", id="kernel-cuda"),
    pytest.param(KERNEL, False, True, "needs Triton", id="kernel-interpreter"),
    pytest.param(TRITON, True, False, "needs Triton", id="triton-cuda"),
    pytest.param(TRITON, False, True, "needs a CUDA device", id="triton-interpreter"),
])
def test_a_triton_kernels_test_skips_without_triton(marker, cuda, interpreter, why):
    assert gpu_skip_reason(marker, cuda, interpreter, triton=False) == why
