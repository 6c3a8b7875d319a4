"""ggml's vec_dot for the CPU: MUL_MAT's kernels per weight type, src1 converted to the vec_dot type, rows converted
to float32; `type_table` holds each type's kernels, as ggml's `type_traits_cpu` (DESIGN.md, "The CPU kernels")."""
