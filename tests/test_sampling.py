import torch

from schedrl.engine.sampling import uniform_noise


def test_noise_is_uniform_and_a_pure_function_of_its_inputs():
    seeds = torch.arange(2000, dtype=torch.long) * 7919 + (1 << 40)
    index = torch.arange(2000, dtype=torch.long) % 13
    u = uniform_noise(seeds, index, 500)  # (2000, 500) = 1e6 draws
    assert float(u.min()) > 0 and float(u.max()) < 1
    counts = torch.histc(u, bins=20, min=0, max=1)
    expected = u.numel() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 50  # 19 degrees of freedom: p ~ 1e-4 at 45
    # no linear correlation between neighbouring vocabulary ids, nor between neighbouring seeds
    c = u - 0.5
    assert abs(float((c[:, 1:] * c[:, :-1]).mean())) < 1e-3
    assert abs(float((c[1:] * c[:-1]).mean())) < 1e-3
    torch.testing.assert_close(uniform_noise(seeds[:5], index[:5], 500), u[:5], atol=0, rtol=0)
    assert not torch.equal(uniform_noise(seeds[:5], index[:5] + 1, 500), u[:5])
