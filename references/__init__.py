"""Float64 references, one module per op family, written from the math and importable on their own.

They import nothing from `attnbench.kernels` (and nothing from the harness): each function takes plain
tensors in the canonical layouts of docs/conventions.md and returns the exact result in float64, or, with
`precision=<low dtype>`, the native-precision twin the tolerance rule scales from.
"""
