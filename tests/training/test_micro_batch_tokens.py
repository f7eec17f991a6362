"""``algo.micro_batch_tokens``: micro-batches cut by a token budget compute what the row-count cut computes,
with the same number of passes on every rank."""

from __future__ import annotations

import hydra
import pytest
import torch

from lightning_epo.core.errors import ConfigError
from lightning_epo.rollout.batch import RolloutBatch
from lightning_epo.runtime.config import validate
from tests.training.test_module import fit_one_step, params, synthetic_batch

SGD = ["optim.optimizer._target_=torch.optim.SGD", "~optim.optimizer.betas", "~optim.optimizer.weight_decay",
       "optim.actor_lr=0.05", "optim.critic_lr=0.05", "optim.grad_clip=1e9", "optim.warmup_ratio=0"]


def cut_by_rows(size: int) -> list[str]:
    """The overrides that cut micro-batches by ``size`` rows instead of the default token budget."""
    return ["algo.micro_batch_tokens=null", f"algo.micro_batch_size={size}"]


def batch_of_lengths(lengths: list[int]) -> RolloutBatch:
    """A batch whose row ``i`` holds ``lengths[i]`` tokens (right-padded; only the mask matters here)."""
    mask = (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]).long()
    zeros = torch.zeros(len(lengths), dtype=torch.long)
    return RolloutBatch(mask, mask, mask.bool(), zeros, zeros, zeros, zeros.float(), zeros.float(), zeros)


def test_split_by_tokens_sorts_rows_and_keeps_each_padded_micro_batch_within_the_budget():
    lengths = [5, 12, 3, 9, 30, 7, 7, 2, 11]
    batch = batch_of_lengths(lengths)
    rows = torch.tensor([8, 0, 1, 2, 3, 4, 5, 6, 7])
    cuts = batch.split_by_tokens(rows, budget=24)
    assert sorted(torch.cat(cuts).tolist()) == sorted(rows.tolist())  # every row once
    assert [lengths[int(r)] for r in torch.cat(cuts)] == sorted(lengths, reverse=True)
    for cut in cuts:
        padded = len(cut) * max(lengths[int(r)] for r in cut)
        assert padded <= 24 or len(cut) == 1  # the 30-token row alone
    assert [len(cut) for cut in cuts] == [1, 2, 2, 3, 1]  # 30 | 12 11 | 9 7 | 7 5 3 | 2: the greedy cut
    assert batch.select(cuts[2]).input_ids.shape == (2, 9)  # trimmed to the micro-batch's own longest row


def test_every_rank_runs_as_many_passes_as_the_rank_that_needs_the_most(compose_cfg, monkeypatch):
    """Two ranks, one with far more tokens: both get the larger count of micro-batches per group, the smaller
    one filled with empty micro-batches (each a zero-weight pass), and no row lost or repeated."""
    # rows of ones: each begins the longer ones, which model.fold_turns would fold into one pass
    cfg = compose_cfg("algo=ppo_epo", "algo.micro_batch_tokens=20", "model.fold_turns=false")
    module = hydra.utils.instantiate(cfg.module)
    ranks = [batch_of_lengths([10, 10, 10, 10, 10, 10]), batch_of_lengths([4, 3])]
    groups = [[torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])], [torch.tensor([0]), torch.tensor([1])]]
    local = []
    monkeypatch.setattr(module, "_reduce", lambda t, op="sum": local.append(t) or t)
    for batch, rank_groups in zip(ranks, groups):
        module._micro_batches(batch, rank_groups)
    most = torch.stack(local).max(0).values  # what the all-reduce with max gives every rank
    monkeypatch.setattr(module, "_reduce", lambda t, op="sum": most if op == "max" else pytest.fail(op))
    cut = [module._micro_batches(batch, rank_groups) for batch, rank_groups in zip(ranks, groups)]
    assert [[len(mbs) for mbs in rank] for rank in cut] == [[2, 2], [2, 2]]
    assert [len(rows) for rows in cut[1][0]] == [1, 0]
    for rank, rank_groups in zip(cut, groups):
        for mbs, rows in zip(rank, rank_groups):
            assert sorted(torch.cat(mbs).tolist()) == rows.tolist()


def test_old_policy_pass_gives_the_same_logprobs_entropies_and_values(compose_cfg, monkeypatch):
    """Log-probs, entropies, values and reference log-probs of a token-budget cut (fp32) match one pass over
    the whole batch on every real token; budget 12 is below the longest row (15 tokens), which then runs alone.
    (Values past a row's end read padding, which depends on the micro-batch: no estimator reads them.)"""
    module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo", "algo.kl_coef=0.1", *cut_by_rows(64)).module)
    module.configure_model()
    monkeypatch.setattr(module, "_reduce", lambda t, op="sum": t)  # one process, no trainer
    batch = synthetic_batch(module.actor.config.vocab_size, seed=4, trajectories=8)
    whole, real = module._old_policy_pass(batch, torch.arange(0)), batch.attention_mask.bool()
    for budget in (12, 40):
        module.algo.micro_batch_tokens = budget
        (micro_batches,) = module._micro_batches(batch, [torch.arange(len(batch))])
        assert len(micro_batches) > 2
        cut = module._old_policy_pass(batch, torch.arange(0))
        assert whole.keys() == cut.keys() == {"old_logprobs", "entropy", "old_values", "ref_logprobs"}
        for name in whole:
            torch.testing.assert_close(cut[name][real], whole[name][real], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("algo", ["ppo_epo", "grpo_epo"])
def test_parameters_after_one_update_match_the_row_count_cut(compose_cfg, algo):
    """Two PPO epochs of two mini-batches each, cut by rows (one pass per mini-batch) or by a token budget
    (several uneven passes): the same parameters and logged losses after the RL step."""
    base = [f"algo={algo}", "algo.ppo_epochs=2", "algo.mini_batches=2", *SGD]
    batches = [synthetic_batch(500, seed=5, trajectories=8)]
    results = []
    for cut in (cut_by_rows(64), ["algo.micro_batch_tokens=30"]):
        module, trainer = fit_one_step(compose_cfg(*base, *cut), batches)
        results.append((params(module), {k: float(v) for k, v in trainer.callback_metrics.items()}))
    (rows_p, rows_m), (tokens_p, tokens_m) = results
    for name in rows_p:
        torch.testing.assert_close(tokens_p[name], rows_p[name], atol=1e-6, rtol=1e-5, msg=name)
    for key in ("loss/policy", "loss/entropy", "loss/total"):
        assert tokens_m[key] == pytest.approx(rows_m[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", "true"])
def test_micro_batch_tokens_must_be_a_positive_integer(compose_cfg, bad):
    with pytest.raises(ConfigError, match="algo.micro_batch_tokens"):
        validate(compose_cfg("algo=ppo", f"algo.micro_batch_tokens={bad}"))


@pytest.mark.parametrize(("overrides", "fix"), [(["algo.micro_batch_size=8"], "algo.micro_batch_tokens=null"),
                                                (["algo.micro_batch_tokens=null"], "set one")])
def test_exactly_one_of_the_token_budget_and_the_row_count_cuts_micro_batches(compose_cfg, overrides, fix):
    """A row count given beside the default token budget would be ignored: refused at start, naming the fix."""
    with pytest.raises(ConfigError, match=fix):
        validate(compose_cfg("algo=ppo", *overrides))
