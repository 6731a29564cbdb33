"""exp2, reciprocal and one-pass softmax: integer models against float64."""

import numpy as np
import pytest

from golden.exp import (
    exp2_neg,
    exp2_neg_float,
    exp2_tables,
    logit_multiplier,
    quantize_log2_logit,
    to_log2_domain,
)
from golden.reciprocal import divide, reciprocal, reciprocal_seed_table
from golden.softmax import softmax, softmax_float
from spec.numerics import NUMERICS, Numerics


def test_exp2_tables_shape_and_ends():
    hi, lo = exp2_tables()
    assert hi.shape == (32,) and lo.shape == (32,)
    assert hi[0] == lo[0] == 1 << 15
    assert np.all(np.diff(hi) < 0) and np.all(np.diff(lo) < 0)
    assert hi[16] == round(2**15 / np.sqrt(2))


def test_exp2_neg_error_bound():
    d = np.arange(0, 20 << 10)
    for bits in (7, 14, 15):
        got = exp2_neg(d, bits)
        want = exp2_neg_float(d) * (1 << bits)
        # table rounding (<= 1.5 LSB of Q1.15, scaled) plus the final rounding (0.5 LSB)
        assert np.abs(got - want).max() <= 0.5 + 1.5 * 2.0 ** (bits - 15) + 1e-9
    assert exp2_neg(np.array([0]), 15)[0] == 1 << 15
    assert exp2_neg(np.array([1 << 10]), 15)[0] == 1 << 14  # 2**-1 exactly
    assert exp2_neg(np.array([40 << 10]), 15)[0] == 0


def test_logit_multiplier_left_shift_and_accuracy():
    for scale in (1e-4, 0.3, 1.9, 3.7, 1000.0, 1e6):
        m, sh = logit_multiplier(scale)
        assert abs(m * 2.0**-sh / scale - 1) < 2**-15
        s = np.array([-12345, 0, 777])
        bound = 0.5 + abs(s).max() * scale * 2**-15
        assert np.abs(to_log2_domain(s, m, sh) - s * scale).max() <= bound
    assert sh < 0  # 1e6 > 2**16 needs a left shift


def test_quantize_log2_logit():
    assert quantize_log2_logit(np.log(2.0)) == 1024
    assert quantize_log2_logit(0.0) == 0


def test_reciprocal_error_bound():
    big = np.geomspace(1, 2**40, 5000).astype(np.int64)
    divisors = np.unique(np.concatenate([np.arange(1, 5000), big]))
    y, e = reciprocal(divisors)
    rel = np.abs(y * 2.0 ** -(16 + e) * divisors - 1)
    assert rel.max() < 2**-14
    assert np.all((y >= 1 << 15) & (y <= 1 << 16))
    assert reciprocal(np.array([1, 2, 1 << 20]))[0].tolist() == [1 << 16] * 3
    assert reciprocal_seed_table().shape == (32,)


def test_reciprocal_newton_steps_matter():
    divisors = np.arange(1, 3000)
    no_newton = Numerics(recip_newton_steps=0)
    y0, e0 = reciprocal(divisors, no_newton)
    y2, e2 = reciprocal(divisors)
    err0 = np.abs(y0 * 2.0 ** -(16 + e0) * divisors - 1).max()
    err2 = np.abs(y2 * 2.0 ** -(16 + e2) * divisors - 1).max()
    assert err0 > 100 * err2


def test_divide_rounds_half_up():
    assert divide(np.array([3, -3, 1]), np.array([2, 2, 4]), 0).tolist() == [2, -1, 0]


def test_softmax_matches_float():
    rng = np.random.default_rng(3)
    z = rng.normal(0, 3, (200, 9))
    x = quantize_log2_logit(z)
    p = softmax(x) / 2**NUMERICS.gate_frac_bits
    assert np.abs(p - softmax_float(z)).max() < 1e-3
    assert np.abs(p.sum(axis=-1) - 1).max() < 1e-3


def test_softmax_mask():
    x = np.array([[0, 5000, -3]])
    p = softmax(x, np.array([[True, False, True]]))
    assert p[0, 1] == 0 and p[0, 0] > p[0, 2]
    with pytest.raises(ValueError, match="unmasked"):
        softmax(x, np.zeros((1, 3), bool))
