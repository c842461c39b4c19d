"""ROVER: act by a softmax over the Q-values of the uniformly random policy, with Q carried by the LLM's
own log-probs.

Conventions as ``losses.py``. ``mean_logp`` and ``old_mean_logp`` (B, T) are, at each target position
t, the mean over the whole vocabulary V of log pi_theta(v | s_t) and log pi_old(v | s_t).

References: He, Ye, Cai, Hu, Jiao, Jiang, Pan 2025, "Random Policy Valuation is Enough for LLM
Reasoning with Verifiable Rewards", arXiv:2509.24981.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from schedrl.algos.losses import broadcast_adv, masked_mean
from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec
from schedrl.registry import check_arg


@dataclass(frozen=True)
class RoverArgs:
    rover_temp: float = 1.0  # rho of Q = rho * log(pi_theta / pi_old)

    def __post_init__(self) -> None:
        check_arg(self.rover_temp > 0, "rover_temp", self.rover_temp, "> 0")


def vocab_mean_logp(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """(1/|V|) sum_v log softmax(logits / temperature)_v per position.  (B, T, V) -> (B, T)."""
    return torch.log_softmax(logits / temperature, dim=-1).mean(dim=-1)


@register(
    "loss",
    "rover",
    "regress Q = rho log(pi_theta/pi_old) on r + mean_vocab Q(next) (ROVER)",
    LossSpec(frozenset({"vocab_stat"}), args=RoverArgs, vocab_stat=vocab_mean_logp),
)
def rover_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    mean_logp: Tensor,
    old_mean_logp: Tensor,
    rover_temp: float = 1.0,
    agg: str = "token_mean",
) -> tuple[Tensor, dict[str, float]]:
    """Policy evaluation of the uniform random policy, with the policy read off as softmax(Q / rho).

    Q(s_t, a)  = rho (log pi_theta(a | s_t) - log pi_old(a | s_t))          (Q through the policy)
    Qhat_t     = r~ + (1/|V|) sum_{a'} Q(s_{t+1}, a')   (t not last);   Qhat_T = r~   (last token)
    L          = agg( (Q(s_t, o_t) - sg(Qhat_t))^2 )

    The theorem (He et al. 2025, Thm. 3.1): in a deterministic tree MDP with binary terminal reward the
    greedy policy of Q^{pi_u}, the Q-function of the uniform policy pi_u, is optimal; ROVER samples from
    softmax(Q^{pi_u} / rho) for diversity. The Bellman backup of pi_u is r + E_{a' ~ uniform} Q(s', a'):
    an unweighted mean over the vocabulary, computed here exactly from the logits (``mean_logp``,
    ``old_mean_logp`` at position t + 1).

    What is approximated for LLMs, exactly:
    1. Q^{pi_u} is not a separate network: it is parameterised as rho times the log-ratio of the policy
       to pi_old, so pi_theta = pi_old exp(Q / rho) / Z is the softmax over Q *relative to pi_old*, and
       only Q's increment since pi_old is learned (the pretrained prior stands in for the rest).
    2. The reward is not only terminal: r~ (``adv``, one per sequence; use the ``grpo`` estimator with
       std_normalize=False for the paper's group-mean-centred r - mean_g(r)) is added at every token.
    3. Q is fitted on the sampled tokens of the batch only (one regression target per token), not over
       the whole tree; pi_old is refreshed every step, so Q restarts from 0 each step.
    rho = ``rover_temp``. At pi_theta = pi_old, Q = 0 and grad L = -2 rho agg(r~ grad log pi_theta):
    the first update is REINFORCE with the centred reward.

    Stats: ``q_mean`` (of Q on sampled tokens), ``q_target_mean``.
    """
    if rover_temp <= 0:
        raise ValueError(f"rover_temp must be > 0; got {rover_temp}")
    m = mask.bool()
    a = broadcast_adv(adv.detach().to(logp.dtype), logp).expand_as(logp)  # r~ on every token, (B, T)
    q = rover_temp * (logp - old_logp.detach()).masked_fill(~m, 0.0)  # Q(s_t, o_t), (B, T)
    q_next_mean = rover_temp * (mean_logp - old_mean_logp).detach()  # (1/|V|) sum_a' Q(s_t, a'), (B, T)
    nxt = torch.zeros_like(q_next_mean)
    nxt[:, :-1] = q_next_mean[:, 1:]  # value of s_{t+1}
    has_next = torch.zeros_like(m)
    has_next[:, :-1] = m[:, 1:]  # the next target is a completion token too (not past the end)
    target = a + torch.where(has_next, nxt, 0.0)  # Qhat_t
    loss = masked_mean((q - target.detach()) ** 2, m, agg)
    with torch.no_grad():
        stats = {"q_mean": masked_mean(q, m).item(), "q_target_mean": masked_mean(target, m).item()}
    return loss, stats
