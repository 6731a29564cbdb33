"""The GEMM and requantisation golden models: exactness, wrap, rounding, saturation, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden.gemm import gemm, gemm_float, quantize_multiplier, requantize, requantize_float
from spec.numerics import NUMERICS


def test_gemm_equals_float_product_below_the_wrap_depth():
    rng = np.random.default_rng(0)
    a, b = rng.integers(-128, 128, (17, 300)), rng.integers(-128, 128, (300, 9))
    assert gemm(a, b).dtype == np.int32
    assert (gemm(a, b) == gemm_float(a, b)).all()


def test_gemm_extremes_and_wrap_like_a_32_bit_accumulator():
    depth = NUMERICS.max_exact_depth
    a, b = np.full((1, depth), -128), np.full((depth, 1), -128)
    assert gemm(a, b)[0, 0] == depth * 16384  # the largest sum that does not wrap
    a, b = np.full((1, depth + 1), -128), np.full((depth + 1, 1), -128)
    assert gemm(a, b)[0, 0] == (depth + 1) * 16384 - 2**32  # wraps like the hardware


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        (np.zeros((2, 3), int), np.zeros((4, 2), int), "inner dimensions"),
        (np.zeros(3, int), np.zeros((3, 2), int), "2-D"),
        (np.zeros((2, 0), int), np.zeros((0, 2), int), "empty"),
        (np.full((2, 2), 128), np.zeros((2, 2), int), "outside int8"),
        (np.zeros((2, 2)), np.zeros((2, 2), int), "integers"),
    ],
)
def test_gemm_rejects_bad_operands(a, b, message):
    with pytest.raises(ValueError, match=message):
        gemm(a, b)


def test_requantize_rounds_half_up_and_saturates():
    # multiplier/2**shift = 1/2: 5 -> 2.5 -> 3, -5 -> -2.5 -> -2, 3 -> 1.5 -> 2
    acc = np.array([5, -5, 3, -3, 1000, -1000])
    assert requantize(acc, 1, 1).tolist() == [3, -2, 2, -1, 127, -128]
    assert requantize(np.array([7, -7]), 3, 0).tolist() == [21, -21]  # shift 0: no rounding


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    scale=st.floats(min_value=1e-6, max_value=1000.0),
    acc=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=20),
)
def test_requantize_within_one_lsb_of_float(scale, acc):
    multiplier, shift = quantize_multiplier(scale)
    assert 2**15 <= multiplier < 2**16
    assert abs(multiplier / 2**shift - scale) <= scale * 2**-16
    acc = np.array(acc)
    got = requantize(acc, multiplier, shift).astype(np.int64)
    assert np.abs(got - requantize_float(acc, scale)).max() <= 1


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan"), 70000.0, 1e-30])
def test_quantize_multiplier_rejects_unrepresentable_scales(scale):
    with pytest.raises(ValueError, match="scale"):
        quantize_multiplier(scale)


def test_requantize_rejects_out_of_range_parameters():
    with pytest.raises(ValueError, match="multiplier"):
        requantize(np.array([1]), 1 << 16, 3)
    with pytest.raises(ValueError, match="shift"):
        requantize(np.array([1]), 3, 64)
    with pytest.raises(ValueError, match="int32"):
        requantize(np.array([2**31]), 3, 4)
