"""pass@k against hand-worked binomials and brute-force subset enumeration; summarize_eval by hand."""

import itertools
import math

import pytest

from schedrl.training.metrics import pass_at_k, percentile, summarize_eval


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 1, 0.0),  # no correct sample: 1 - C(5,1)/C(5,1) = 0
        (5, 5, 1, 1.0),  # all correct: n - c = 0 < k, so 1
        (5, 2, 1, 0.4),  # 1 - C(3,1)/C(5,1) = 1 - 3/5 = c/n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.91666...
        (10, 3, 8, 1.0),  # n - c = 7 < 8: every 8-subset holds a correct sample
        (4, 1, 4, 1.0),  # k = n: the only subset is all samples
    ],
)
def test_pass_at_k_closed_forms(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def _brute_force(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) holding at least one correct sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_subset_enumeration() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_binomials_for_large_n() -> None:
    # The product form must agree with exact integer binomials where the direct ratio still fits.
    n, c, k = 200, 17, 10
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize(
    ("n", "c", "k", "bad"),
    [
        (5, 1, 6, "k=6"),
        (5, 6, 1, "c=6"),
        (-1, 0, 1, "n=-1"),
        (5, -2, 1, "c=-2"),
        (5, 1, -1, "k=-1"),
        (5, 1, 0, "k=0"),
    ],
)
def test_pass_at_k_rejects_bad_args(n: int, c: int, k: int, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        pass_at_k(n, c, k)


def test_percentile_linear_interpolation() -> None:
    # sorted [1, 2, 3, 4]: p50 sits at position 1.5 -> 2.5; p90 at 2.7 -> 3 + 0.7 * (4 - 3) = 3.7
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([4, 1, 3, 2], 90) == pytest.approx(3.7)
    assert percentile([7], 90) == 7.0
    with pytest.raises(ValueError, match="q=101"):
        percentile([1, 2], 101)


def test_summarize_eval_by_hand() -> None:
    rewards = [
        [1.0, 0.0, 0.0, 0.0],  # c = 1 of 4: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2
        [1.0, 1.0, 0.5, 0.0],  # c = 2 (0.5 < threshold): pass@1 = 2/4; pass@2 = 1 - C(2,2)/C(4,2) = 5/6
    ]
    lengths = [10, 20, 30, 40, 50, 60, 70, 80]
    out = summarize_eval(rewards, lengths, k=2)
    assert out["pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert out["pass@2"] == pytest.approx((1 / 2 + 5 / 6) / 2)
    assert out["mean_reward"] == pytest.approx(3.5 / 8)
    assert out["len_mean"] == pytest.approx(45.0)
    assert out["len_p50"] == pytest.approx(45.0)  # position 3.5: between 40 and 50
    assert out["len_p90"] == pytest.approx(73.0)  # position 6.3: 70 + 0.3 * 10
    assert out["len_max"] == 80.0
    # A lower threshold counts the 0.5 as correct: c = 3 of 4, pass@1 = 3/4.
    assert summarize_eval(rewards, lengths, k=2, threshold=0.5)["pass@1"] == pytest.approx(
        (1 / 4 + 3 / 4) / 2
    )


def test_summarize_eval_rejects_too_few_samples() -> None:
    with pytest.raises(ValueError, match="task 1 has n=1 samples, fewer than k=2"):
        summarize_eval([[1.0, 0.0], [1.0]], [1, 2, 3], k=2)
    with pytest.raises(ValueError, match="empty"):
        summarize_eval([], [1], k=1)


def test_length_icc_by_hand() -> None:
    import math

    import torch

    from schedrl.orchestrate.step_metrics import length_icc

    e = math.e
    groups = torch.tensor([0, 0, 1, 1])
    # log lengths 0, 0 | 2, 2: all the spread is between the groups
    assert length_icc(torch.tensor([1.0, 1.0, e**2, e**2]), groups, 2) == pytest.approx(1.0)
    # log lengths 0, 2 | 0, 2: all of it within them
    assert length_icc(torch.tensor([1.0, e**2, 1.0, e**2]), groups, 2) == pytest.approx(0.0)
    # log lengths 0, 2 | 2, 2: mean 1.5; total 2.25 + 3 x 0.25 = 3; within 1 + 1 + 0 = 2: 1 - 2/3
    assert length_icc(torch.tensor([1.0, e**2, e**2, e**2]), groups, 2) == pytest.approx(1 / 3)
    assert length_icc(torch.tensor([5.0, 5.0, 5.0, 5.0]), groups, 2) == 1.0
