import math

import pytest

from schedrl.training.schedules import constant, cosine_decay, linear_warmup, make_schedule


def test_closed_form_values():
    assert [constant(0.5)(t) for t in (0, 10)] == [0.5, 0.5]
    warm = linear_warmup(1.0, 4)  # (t + 1) / 4, then flat
    assert [warm(t) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = cosine_decay(1.0, total_steps=10, warmup_steps=2)
    assert cos(0) == 0.5 and cos(1) == 1.0  # warm-up
    assert cos(2) == 1.0  # decay starts at p = 0
    assert math.isclose(cos(6), 0.5)  # p = 4/8 -> (1 + cos(pi/2)) / 2
    assert math.isclose(cos(10), 0.0, abs_tol=1e-12)
    floor = cosine_decay(1.0, total_steps=4, final_fraction=0.1)
    assert math.isclose(floor(4), 0.1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: constant(-1.0), "value must be >= 0, got -1.0"),
        (lambda: cosine_decay(1.0, 0), "total_steps must be > 0, got 0"),
        (lambda: cosine_decay(1.0, 5, warmup_steps=5), "warmup_steps (5) must be < total_steps (5)"),
        (lambda: make_schedule("step", 1.0, 0, 10), "unknown schedule 'step'"),
    ],
)
def test_bad_arguments(build, message):
    with pytest.raises(ValueError) as err:
        build()
    assert message in str(err.value)
