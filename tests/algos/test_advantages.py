import pytest
import torch

from lightning_epo.algos import ADVANTAGES, AdvantageInputs, entropy_shaped_advantage, whiten
from lightning_epo.algos.advantages import discounted_turn_returns, last_token_rewards


def make_batch():
    """Two trajectories: traj 0 has turns of 2 and 3 response tokens, traj 1 one turn of 2 tokens."""
    mask = torch.zeros(3, 8, dtype=torch.bool)
    mask[0, 3:5] = True  # traj 0 turn 0
    mask[1, 4:7] = True  # traj 0 turn 1
    mask[2, 2:4] = True  # traj 1 turn 0
    return AdvantageInputs(
        mask=mask,
        turn_rewards=torch.tensor([-0.1, 10.0, 0.0]),
        episode_returns=torch.tensor([9.9, 9.9, 0.0]),
        traj_ids=torch.tensor([0, 0, 1]),
        turn_idx=torch.tensor([0, 1, 0]),
        group_ids=torch.tensor([0, 0, 0]),
        values=torch.randn(3, 8),
    )


def gae_loop(inp, gamma, lam):
    """Textbook GAE over each trajectory's agent tokens, in plain Python."""
    adv = torch.zeros(inp.mask.shape)
    for j in inp.traj_ids.unique().tolist():
        turn_rows = sorted((int(inp.turn_idx[r]), r) for r in range(len(inp.traj_ids)) if inp.traj_ids[r] == j)
        seq = []
        for _, r in turn_rows:
            cols = inp.mask[r].nonzero().squeeze(-1).tolist()
            for i, c in enumerate(cols):
                seq.append((r, c, float(inp.turn_rewards[r]) if i == len(cols) - 1 else 0.0))
        running = 0.0
        for t in reversed(range(len(seq))):
            r, c, rew = seq[t]
            v_next = float(inp.values[seq[t + 1][0], seq[t + 1][1]]) if t + 1 < len(seq) else 0.0
            delta = rew + gamma * v_next - float(inp.values[r, c])
            running = delta + gamma * lam * running
            adv[r, c] = running
    return adv


def turn_gae_loop(inp, gamma, lam):
    """Textbook GAE over each trajectory's turns (turn value = value at its first response token), each token's
    advantage the turn's lambda-return minus its own value, in plain Python."""
    adv = torch.zeros(inp.mask.shape)
    for j in inp.traj_ids.unique().tolist():
        turn_rows = [r for _, r in sorted((int(inp.turn_idx[r]), r) for r in range(len(inp.traj_ids)) if inp.traj_ids[r] == j)]
        cols = {r: inp.mask[r].nonzero().squeeze(-1).tolist() for r in turn_rows}
        lambda_return, v_next = 0.0, 0.0
        for r in reversed(turn_rows):
            lambda_return = float(inp.turn_rewards[r]) + gamma * ((1 - lam) * v_next + lam * lambda_return)
            for c in cols[r]:
                adv[r, c] = lambda_return - float(inp.values[r, c])
            v_next = float(inp.values[r, cols[r][0]])
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_token_unit_gae_matches_loop_over_agent_tokens(gamma, lam):
    torch.manual_seed(0)
    inp = make_batch()
    adv, ret = ADVANTAGES.get("gae")(inp, gamma=gamma, lam=lam, unit="token")
    assert torch.allclose(adv, gae_loop(inp, gamma, lam), atol=1e-5)
    assert torch.allclose(ret[inp.mask], (adv + inp.values)[inp.mask], atol=1e-6)
    assert (adv[~inp.mask] == 0).all()


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_turn_unit_gae_matches_loop_over_turns(gamma, lam):
    torch.manual_seed(0)
    inp = make_batch()
    adv, ret = ADVANTAGES.get("gae")(inp, gamma=gamma, lam=lam)  # unit="turn" is the default
    assert torch.allclose(adv, turn_gae_loop(inp, gamma, lam), atol=1e-5)
    assert torch.allclose(ret[inp.mask], (adv + inp.values)[inp.mask], atol=1e-6)
    assert (adv[~inp.mask] == 0).all()


def two_turns_of_five_tokens(reward: float) -> AdvantageInputs:
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[:, 3:8] = True
    return AdvantageInputs(
        mask=mask,
        turn_rewards=torch.tensor([0.0, reward]),
        episode_returns=torch.tensor([reward, reward]),
        traj_ids=torch.tensor([0, 0]),
        turn_idx=torch.tensor([0, 1]),
        group_ids=torch.tensor([0, 0]),
        values=torch.zeros(2, 8),
    )


def test_turn_unit_discounts_once_per_environment_step():
    """2 turns x 5 tokens, gamma 0.9, reward R at the end, V = 0: turn 0's target is 0.9 R (per token: 0.9^5 R)."""
    inp = two_turns_of_five_tokens(10.0)
    _, turn = ADVANTAGES.get("gae")(inp, gamma=0.9, lam=1.0)
    assert torch.allclose(turn[0, 3:], torch.full((5,), 9.0)) and torch.allclose(turn[1, 3:], torch.full((5,), 10.0))
    _, token = ADVANTAGES.get("gae")(inp, gamma=0.9, lam=1.0, unit="token")
    assert token[0, 3].item() == pytest.approx(10.0 * 0.9**9, rel=1e-5)


def test_unknown_gae_unit_is_refused():
    with pytest.raises(ValueError, match="turn, token"):
        ADVANTAGES.get("gae")(two_turns_of_five_tokens(1.0), unit="step")


@pytest.mark.parametrize("name", ["gae", "grpo"])
def test_values_and_rewards_planted_on_environment_tokens_change_nothing(name):
    torch.manual_seed(1)
    inp = make_batch()
    adv, _ = ADVANTAGES.get(name)(inp)
    planted = AdvantageInputs(**{k: v.clone() if torch.is_tensor(v) else v for k, v in vars(inp).items()})
    planted.values[~inp.mask] = 1e6
    adv2, _ = ADVANTAGES.get(name)(planted)
    assert torch.equal(adv, adv2)  # identity is the point: masked entries are selected away (torch.where), not summed


def test_reward_sits_on_last_response_token_of_each_turn():
    inp = make_batch()
    r = last_token_rewards(inp.mask, inp.turn_rewards)
    assert r[0, 4] == pytest.approx(-0.1) and r[1, 6] == 10.0 and r.abs().sum() == pytest.approx(10.1)


def test_grpo_normalises_within_groups_counting_each_trajectory_once():
    mask = torch.ones(5, 2, dtype=torch.bool)
    inp = AdvantageInputs(
        mask=mask,
        turn_rewards=torch.zeros(5),
        # traj 0 has 3 turns (return 10), traj 1 one turn (return 0): group 0; traj 2 alone in group 1
        episode_returns=torch.tensor([10.0, 10.0, 10.0, 0.0, 4.0]),
        traj_ids=torch.tensor([0, 0, 0, 1, 2]),
        turn_idx=torch.tensor([0, 1, 2, 0, 0]),
        group_ids=torch.tensor([0, 0, 0, 0, 1]),
    )
    adv, ret = ADVANTAGES.get("grpo")(inp)
    std = torch.tensor([10.0, 0.0]).std()
    assert ret is None
    assert torch.allclose(adv[:3], torch.full((3, 2), 5.0 / (std + 1e-6)))
    assert torch.allclose(adv[3], torch.full((2,), -5.0 / (std + 1e-6)))
    assert (adv[4] == 0).all()  # a group of one has no signal
    centred, _ = ADVANTAGES.get("grpo")(inp, norm_by_std=False)
    assert torch.allclose(centred[0], torch.full((2,), 5.0))


def gigpo_batch():
    """One group, two trajectories of two one-token turns. Both start from observation 0; traj 0 then
    sees state 1 and wins (rewards 0, 10), traj 1 sees state 2 after an invalid action (-0.1, 0)."""
    return AdvantageInputs(
        mask=torch.ones(4, 1, dtype=torch.bool),
        turn_rewards=torch.tensor([0.0, 10.0, -0.1, 0.0]),
        episode_returns=torch.tensor([10.0, 10.0, -0.1, -0.1]),
        traj_ids=torch.tensor([0, 0, 1, 1]),
        turn_idx=torch.tensor([0, 1, 0, 1]),
        group_ids=torch.tensor([0, 0, 0, 0]),
        state_ids=torch.tensor([0, 1, 0, 2]),
    )


def test_discounted_turn_returns_follow_turn_order_not_row_order():
    inp = gigpo_batch()
    shuffled = torch.tensor([3, 1, 0, 2])
    returns = discounted_turn_returns(
        inp.turn_rewards[shuffled], inp.traj_ids[shuffled], inp.turn_idx[shuffled], gamma=0.5
    )
    assert torch.allclose(returns, torch.tensor([5.0, 10.0, -0.1, 0.0])[shuffled])


def test_gigpo_adds_a_step_advantage_over_shared_states():
    """A^E = +-1/sqrt(2) per trajectory; the shared start state compares R_0 = 0.95*10 with -0.1
    (A^S = +-1/sqrt(2)); the states seen once get A^S = 0."""
    inp = gigpo_batch()
    adv, ret = ADVANTAGES.get("gigpo")(inp, gamma=0.95, step_weight=1.0)
    half = 2**-0.5
    assert ret is None
    assert torch.allclose(adv.squeeze(-1), torch.tensor([2 * half, half, -2 * half, -half]), atol=1e-5)
    adv_episode_only, _ = ADVANTAGES.get("gigpo")(inp, step_weight=0.0)
    assert torch.equal(adv_episode_only, ADVANTAGES.get("grpo")(inp)[0])  # A^E is GRPO's, plus an exact 0 * A^S


def test_gigpo_without_state_ids_says_what_is_missing():
    inp = gigpo_batch()
    inp.state_ids = None
    with pytest.raises(ValueError, match="state_ids"):
        ADVANTAGES.get("gigpo")(inp)


def test_gae_without_critic_says_what_to_do():
    inp = make_batch()
    inp.values = None
    with pytest.raises(ValueError, match="critic"):
        ADVANTAGES.get("gae")(inp)


def test_entropy_shaped_advantage_is_capped_and_keeps_sign():
    adv = torch.tensor([2.0, -2.0, 0.0, 1.0])
    h = torch.tensor([10.0, 10.0, 10.0, 0.5], requires_grad=True)
    out = entropy_shaped_advantage(adv, h, alpha=0.4, kappa=2.0)
    assert torch.allclose(out, torch.tensor([3.0, -1.0, 0.0, 1.2]))
    assert not out.requires_grad


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="gae, gigpo, grpo"):
        ADVANTAGES.get("vtrace")


def test_whitening_uses_the_moments_of_every_rank():
    torch.manual_seed(0)
    advantages, mask = torch.randn(4, 6), torch.rand(4, 6) > 0.3
    whole = whiten(advantages, mask)
    assert whole[mask].mean().abs() < 1e-6 and whole[mask].std(unbiased=False) == pytest.approx(1.0, abs=1e-4)
    assert (whole[~mask] == 0).all()
    # rank 0 holds rows 0-1, rank 1 rows 2-3: with the moments summed over both, rank 0 whitens its rows as one
    # process holding all four does
    rank1 = torch.stack([advantages[2:][mask[2:]].sum(), (advantages[2:][mask[2:]] ** 2).sum(), mask[2:].sum().float()])
    rank0 = whiten(advantages[:2], mask[:2], reduce=lambda own: own + rank1)
    assert torch.allclose(rank0, whole[:2], atol=1e-6)
    assert not torch.allclose(whiten(advantages[:2], mask[:2]), whole[:2], atol=1e-3)  # its own moments differ
