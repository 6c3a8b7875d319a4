"""A small test backend with memory of its own that computes only MUL_MAT, as ggml's BLAS backend does.

Its buffers live in an address space of their own (a numpy store behind a
fake base address that no host code can dereference), so data moves in and
out only through `tensor_set`/`tensor_get`, as with device memory. Tests use
it to see op support drive the scheduler's assignments and split inputs
cross a real memory boundary.
"""

from pyggml.backends.testing_blas.backend import TestingBLASBackend, testing_blas_init
from pyggml.backends.testing_blas.buffer import TESTING_BLAS_ALIGNMENT, TestingBLASBuffer

__all__ = ["TESTING_BLAS_ALIGNMENT", "TestingBLASBackend", "TestingBLASBuffer", "testing_blas_init"]
