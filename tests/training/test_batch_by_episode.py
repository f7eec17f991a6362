"""``algo.batch_by_episode``: mini-batches of whole episodes and micro-batches of one episode's rows, so that the
shared-prefix pass covers an episode's fixed prompt text (not only what every prompt shares) and the token budget
counts it once; the update it gives equals the row-wise cut's where the mini-batches are the same."""

from __future__ import annotations

import random

import hydra
import pytest
import torch

from lightning_epo.core.errors import ConfigError
from lightning_epo.models.shared_prefix import shared_prefix_length
from lightning_epo.rollout.batch import collate_episodes
from lightning_epo.runtime.config import validate
from lightning_epo.training.micro_batches import micro_batch_sharing, plan_micro_batches, step_mini_batches
from tests.training.test_micro_batch_tokens import SGD, batch_of_lengths
from tests.training.test_module import fit_one_step, params, synthetic_batch, with_prompt_prefix

SHARED = [5, 6, 7, 8, 9, 10]  # what every prompt begins with (the chat template, the intro)
ONE_PASS = lambda t, op="sum": t  # noqa: E731  (the all-rank reduction of one process)


def episodes_with_fixed_text(seed: int, trajectories: int = 8, turns: int = 4):
    """Episodes whose prompts all begin with :data:`SHARED`, then an episode's own fixed text of 12 tokens (a
    ScienceWorld task line and its action templates), then each turn's fresh tokens: the rows of one episode share
    18 leading tokens, rows of two episodes 6."""
    rng = random.Random(seed)
    batch = synthetic_batch(500, seed=seed, trajectories=trajectories)
    for episode in batch.episodes:
        fixed = [rng.randrange(20, 500) for _ in range(12)]
        while len(episode.turns) < turns:  # every episode long enough to fill several micro-batches
            last = episode.turns[-1]
            episode.turns.append(type(last)(prompt_ids=last.prompt_ids[::-1], response_ids=last.response_ids,
                                            traj_id=last.traj_id, turn_idx=last.turn_idx + 1,
                                            group_id=last.group_id, reward=0.0, episode_return=last.episode_return))
        with_prompt_prefix([episode], fixed)
    with_prompt_prefix(batch.episodes, SHARED)
    return collate_episodes(batch.episodes, pad_token_id=0, stats={"train/reward": 1.0})


def test_the_token_budget_counts_a_shared_prefix_once():
    batch = batch_of_lengths([20, 20, 20, 20])
    rows = torch.arange(4)
    assert [len(cut) for cut in batch.split_by_tokens(rows, budget=30)] == [1, 1, 1, 1]  # 2 x 20 > 30
    # 15 tokens computed once, then 5 a row: 15 + 3 x 5 = 30 fits, a fourth row (35) does not
    assert [len(cut) for cut in batch.split_by_tokens(rows, budget=30, prefix=15)] == [3, 1]


def test_each_micro_batch_holds_one_episode_and_shares_its_fixed_text():
    batch = episodes_with_fixed_text(seed=3)
    rows = torch.randperm(len(batch), generator=torch.Generator().manual_seed(0))
    positions = {}
    for by_episode in (False, True):
        (cuts,) = plan_micro_batches(batch, [rows], 1, 120, fold=False, reduce=ONE_PASS, by_episode=by_episode)
        assert sorted(torch.cat(cuts).tolist()) == sorted(rows.tolist())  # every row once
        sharings = [micro_batch_sharing(batch.select(cut), False, True, None) for cut in cuts]
        positions[by_episode] = sum(s.decoder_positions(len(cut), batch.select(cut).input_ids.shape[1])
                                    for s, cut in zip(sharings, cuts))
        if by_episode:
            assert all(len(batch.traj_ids[cut].unique()) == 1 for cut in cuts)
            assert all(s.prefix >= len(SHARED) + 12 for s, cut in zip(sharings, cuts) if len(cut) > 1)
            assert all(s.decoder_positions(len(cut), batch.select(cut).input_ids.shape[1]) <= 120 or len(cut) == 1
                       for s, cut in zip(sharings, cuts))
        else:
            assert max(len(batch.traj_ids[cut].unique()) for cut in cuts) > 1  # the row-wise cut mixes episodes
    assert positions[True] < 0.9 * positions[False]


def test_mini_batches_draw_whole_episodes_and_the_default_still_draws_rows():
    batch = episodes_with_fixed_text(seed=3)
    algo = {"ppo_epochs": 2, "mini_batches": 3, "batch_by_episode": True}
    minis, fills = step_mini_batches(batch.traj_ids, algo, seed=7)
    for epoch in minis:
        assert sorted(torch.cat(epoch).tolist()) == list(range(len(batch)))
        episodes = [set(batch.traj_ids[mini].tolist()) for mini in epoch]
        assert sum(len(e) for e in episodes) == len(set().union(*episodes)) == 8  # no episode split
    assert not torch.equal(torch.cat(minis[0]), torch.cat(minis[1]))  # each epoch draws anew
    assert fills == 1  # the clipped loss reads the old log-probs: only the first mini-batch's forward gives them
    rows, _ = step_mini_batches(batch.traj_ids, {**algo, "batch_by_episode": False}, seed=7)
    expected = torch.randperm(len(batch), generator=torch.Generator().manual_seed(7)).tensor_split(3)
    assert all(torch.equal(a, b) for a, b in zip(rows[0], expected))  # as before the setting existed


@pytest.mark.parametrize("algo", ["ppo_epo", "grpo_epo"])
def test_one_mini_batch_of_episodes_updates_as_the_row_wise_cut(compose_cfg, algo):
    """One mini-batch a PPO epoch (the whole step either way), two epochs, a token budget that cuts several
    micro-batches: cut by episode (fewer decoder positions) or by rows, the same parameters and logged losses."""
    base = [f"algo={algo}", "algo.ppo_epochs=2", "algo.mini_batches=1", "algo.micro_batch_tokens=80",
            "model.shared_prefix=true", "model.fold_turns=false", *SGD]
    batches = [episodes_with_fixed_text(seed=5)]
    results = []
    for by_episode in ("false", "true"):
        module, trainer = fit_one_step(compose_cfg(*base, f"algo.batch_by_episode={by_episode}"), batches)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        results.append((params(module), metrics | {"decoder_positions": module.clock.decoder_positions}))
    (rows_p, rows_m), (episodes_p, episodes_m) = results
    for name in rows_p:
        torch.testing.assert_close(episodes_p[name], rows_p[name], atol=1e-6, rtol=1e-5, msg=name)
    for key in ("loss/policy", "loss/entropy", "loss/total"):
        assert episodes_m[key] == pytest.approx(rows_m[key], rel=1e-5, abs=1e-7), key
    assert episodes_m["decoder_positions"] < 0.9 * rows_m["decoder_positions"]  # the step's, both epochs


def test_two_mini_batches_of_episodes_train_every_actor_parameter(compose_cfg):
    cfg = compose_cfg("algo=ppo_epo", "algo.mini_batches=2", "algo.batch_by_episode=true", "model.shared_prefix=true",
                      "optim.actor_lr=1e-2", "optim.warmup_ratio=0", "optim.optimizer.weight_decay=0.0")
    module = hydra.utils.instantiate(cfg.module)
    module.configure_model()
    before = params(module)  # the same initial actor weights as the trained module's, loaded from the same directory
    trained, _ = fit_one_step(cfg, [episodes_with_fixed_text(seed=5)])
    after = params(trained)
    assert [n for n in before if n.startswith("actor.") and torch.equal(before[n], after[n])] == []


@pytest.mark.parametrize(("overrides", "fix"), [(["model.shared_prefix=false"], "model.shared_prefix=true"),
                                                (["trainer=deepspeed_stage_3"], "deepspeed_stage_2")])
def test_batch_by_episode_is_refused_where_it_cannot_count_the_prefix_once(compose_cfg, overrides, fix):
    with pytest.raises(ConfigError, match=fix):
        validate(compose_cfg("algo=ppo_epo", "algo.batch_by_episode=true", "model.shared_prefix=true", *overrides))


def test_shared_prefix_length_of_one_episode_is_its_fixed_text():
    batch = episodes_with_fixed_text(seed=3)
    rows = (batch.traj_ids == 2).nonzero().squeeze(1)
    assert shared_prefix_length(batch.input_ids[rows], batch.attention_mask[rows]) >= len(SHARED) + 12
    assert shared_prefix_length(batch.input_ids, batch.attention_mask) == len(SHARED)
