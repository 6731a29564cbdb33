"""Pure NumPy reference models: bit-exact integer models and their float64 twins.

Nothing here imports Amaranth or cocotb. The RTL, the compiler and the testbenches
take their widths and rounding rules from :mod:`spec.numerics`.
"""
