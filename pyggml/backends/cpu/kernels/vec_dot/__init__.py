"""ggml's vec_dot for the CPU: MUL_MAT's kernels per weight type, src1 converted to the vec_dot type, and rows
converted to float32; `type_table` holds each type's kernels, as ggml's `type_traits_cpu`.

Each block's integer dot product is exact, as in ggml's scalar code, and is scaled by the block's scales as
ggml's reference `ggml_vec_dot_<type>_q8_<x>` does; under numerics "x86" the row loops that have a `cols_x86`
follow ggml's AVX2 vec_dot float for float. The loops are written in LLVM vector IR (`ir`): numba leaves
LLVM's SLP vectorizer off, so a block's dot as a Python loop runs scalar. Offsets are applied through exact
identities, e.g. Q4_0's `nibble - 8` as `sum(nibble * y) - 8 * sum(y)`.
"""
