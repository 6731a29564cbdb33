"""golden.ecc: the SECDED code corrects every single-bit and detects every double-bit error."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from golden.ecc import Secded, flip_bits, hamming_bits


@pytest.mark.parametrize(("data_bits", "code_bits"), [(64, 72), (32, 39), (16, 22), (8, 13),
                                                      (1, 4), (128, 137)])
def test_code_sizes(data_bits, code_bits):
    assert Secded(data_bits).code_bits == code_bits
    assert Secded(data_bits).last_position == code_bits - 1


def test_hamming_bits_is_minimal():
    for k in range(1, 300):
        r = hamming_bits(k)
        assert (1 << r) >= k + r + 1 and (1 << (r - 1)) < k + r


def test_data_positions_are_the_non_powers_of_two():
    code = Secded(64)
    used = sorted(code.data_positions + tuple(1 << i for i in range(code.hamming_bits)))
    assert used == list(range(1, code.last_position + 1))


def test_clean_words_round_trip_and_are_systematic():
    code = Secded(64)
    rng = np.random.default_rng(1)
    words = np.array([0, (1 << 64) - 1] + [int(x) for x in rng.integers(0, 2**63, 200)]
                     + [1 << j for j in range(64)], dtype=object)
    codes = code.encode(words)
    assert all(int(c) & ((1 << 64) - 1) == int(w) for c, w in zip(codes, words, strict=True))
    data, corrected, uncorrectable = code.decode(codes)
    assert (data == words).all() and not corrected.any() and not uncorrectable.any()


def test_zero_codeword_is_clean():
    code = Secded(64)
    assert code.encode([0])[0] == 0


@pytest.mark.parametrize("data_bits", [8, 64])
def test_every_single_bit_error_is_corrected(data_bits):
    code = Secded(data_bits)
    rng = np.random.default_rng(data_bits)
    for word in [int(x) for x in rng.integers(0, 1 << min(data_bits, 62), 20)]:
        good = int(code.encode([word])[0])
        bad = [flip_bits(good, [bit]) for bit in range(code.code_bits)]
        data, corrected, uncorrectable = code.decode(bad)
        assert (data == word).all() and corrected.all() and not uncorrectable.any()


@pytest.mark.parametrize("data_bits", [8, 64])
def test_every_double_bit_error_is_detected_and_zeroed(data_bits):
    code = Secded(data_bits)
    word = (1 << data_bits) - 1 - 5
    good = int(code.encode([word])[0])
    pairs = list(itertools.combinations(range(code.code_bits), 2))
    data, corrected, uncorrectable = code.decode([flip_bits(good, pair) for pair in pairs])
    assert uncorrectable.all() and not corrected.any() and (data == 0).all()


def test_shapes_are_kept():
    code = Secded(16)
    words = np.arange(12).reshape(3, 4)
    codes = code.encode(words)
    assert codes.shape == (3, 4)
    assert code.decode(codes)[0].shape == (3, 4)


@pytest.mark.parametrize("bad", [0, -1, 1025])
def test_bad_width_is_refused(bad):
    with pytest.raises(ValueError, match="data_bits"):
        Secded(bad)


def test_words_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="does not fit"):
        Secded(8).encode([256])
    with pytest.raises(ValueError, match="does not fit"):
        Secded(8).decode([1 << 13])
