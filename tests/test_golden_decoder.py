"""golden.decoder: the output projection and residual add between attention and MoE."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden.decoder import ProjectionScales, project_residual, project_residual_float
from golden.gemm import Saturation


@settings(max_examples=40, deadline=None, derandomize=True)
@given(tokens=st.integers(1, 9), channels=st.integers(1, 70), hidden=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_projection_within_half_an_lsb_of_float_unless_it_saturates(tokens, channels,
                                                                     hidden, seed):
    rng = np.random.default_rng(seed)
    o = rng.integers(-128, 128, (tokens, channels)).astype(np.int8)
    w_o = rng.integers(-128, 128, (channels, hidden)).astype(np.int8)
    r = rng.integers(-128, 128, (tokens, hidden)).astype(np.int8)
    scales = ProjectionScales(0.02, 0.01, 0.5 * float(rng.uniform(0.5, 4)))
    saturation = Saturation()
    x = project_residual(o, w_o, r, scales, saturation=saturation)
    real = project_residual_float(o, w_o, r, scales) / scales.hidden
    # One rounding (the projection's requantisation) away from float, where no clamp
    # can reach; a value far past the int8 range is clamped, and counted.
    inside = (real >= -127.5) & (real <= 126.5)
    assert np.abs(x - real)[inside].max(initial=0) <= 0.5 + 1e-6
    assert saturation.saturated >= np.count_nonzero((real > 128) | (real < -129))
    assert np.array_equal(x[real > 128], np.full(np.count_nonzero(real > 128), 127))
    assert set(saturation.sites) == {"proj", "residual"}


def test_bad_shapes_and_scales_are_refused():
    o, w, r = (np.zeros(s, np.int8) for s in ((2, 4), (4, 3), (2, 3)))
    scales = ProjectionScales(1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="residual must be"):
        project_residual(o, w, r[:1], scales)
    with pytest.raises(ValueError, match="w_o takes"):
        project_residual(o, w[1:], r, scales)
    with pytest.raises(ValueError, match="must be a non-empty int8"):
        project_residual(o.astype(np.int16), w, r, scales)
    with pytest.raises(ValueError, match="positive and finite"):
        ProjectionScales(1.0, 0.0, 1.0)
