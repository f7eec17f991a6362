"""The LightningModule's update: every parameter learns, and how the batch is cut never changes it."""

from __future__ import annotations

import random

import hydra
import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_epo.callbacks import BetaSchedule, EntropyWindow
from lightning_epo.rollout.batch import collate_episodes
from lightning_epo.rollout.datamodule import EvalBatch
from lightning_epo.rollout.episode import Episode, TurnSample
from lightning_epo.training import module as module_lib


def synthetic_batch(vocab: int, seed: int = 0, trajectories: int = 4):
    """Episodes of random tokens with 1-3 turns, prompts and responses of varying length."""
    rng = random.Random(seed)
    episodes = []
    for j in range(trajectories):
        ep = Episode(traj_id=j, group_id=j // 2, task="t")
        turns = rng.randint(1, 3)
        for t in range(turns):
            ep.turns.append(
                TurnSample(
                    prompt_ids=[rng.randrange(vocab) for _ in range(rng.randint(3, 9))],
                    response_ids=[rng.randrange(vocab) for _ in range(rng.randint(1, 6))],
                    traj_id=j, turn_idx=t, group_id=j // 2,
                    reward=10.0 if (t == turns - 1 and j % 2 == 0) else -0.1 * (t % 2),
                )
            )
        ep.episode_return = sum(s.reward for s in ep.turns)
        for s in ep.turns:
            s.episode_return = ep.episode_return
        episodes.append(ep)
    return collate_episodes(episodes, pad_token_id=0, stats={"train/reward": 1.0})


def with_prompt_prefix(episodes, prefix: list[int]):
    """``episodes`` with ``prefix`` put before every turn's prompt (in place), for ``model.shared_prefix``."""
    for turn in (t for episode in episodes for t in episode.turns):
        turn.prompt_ids = prefix + turn.prompt_ids
    return episodes


def with_history(episodes):
    """``episodes`` whose turns' prompts carry the episode's earlier turns, token for token (in place), as the
    environments' prompts do: each turn's row then begins the next one's (``model.fold_turns``)."""
    for episode in episodes:
        for before, turn in zip(episode.turns, episode.turns[1:]):
            turn.prompt_ids = before.prompt_ids + before.response_ids + turn.prompt_ids
    return episodes


# Plain SGD at a constant rate, no clipping: no Adam normalisation to blow float32 rounding up into whole steps, so two
# ways of computing one update can be compared parameter by parameter.
PLAIN_SGD = ["optim.optimizer._target_=torch.optim.SGD", "~optim.optimizer.betas", "~optim.optimizer.weight_decay",
             "optim.actor_lr=0.05", "optim.critic_lr=0.05", "optim.grad_clip=1e9", "optim.warmup_ratio=0"]


def fit_one_step(cfg, batches, seed=0):
    """Run ``len(batches)`` RL steps of the configured module on fixed batches; return the module."""
    L.seed_everything(seed)
    module = hydra.utils.instantiate(cfg.module)
    callbacks = [
        EntropyWindow(cfg.algo.epo.window),
        BetaSchedule(cfg.total_steps, cfg.algo.epo.beta),
    ]
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, limit_train_batches=len(batches),
    )
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None, collate_fn=lambda b: b))
    return module, trainer


def params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("algo", ["ppo_epo", "grpo_epo"])
def test_every_actor_parameter_changes_after_one_step(compose_cfg, algo):
    cfg = compose_cfg(f"algo={algo}", "optim.optimizer.weight_decay=0.0", "optim.actor_lr=1e-2", "optim.warmup_ratio=0")
    module = hydra.utils.instantiate(cfg.module)
    module.configure_model()
    before = params(module)
    batch = synthetic_batch(module.actor.config.vocab_size)
    torch.manual_seed(0)
    trained, _ = fit_one_step(cfg, [batch])
    trained_params = params(trained)
    # `before` comes from a second module: the same initial actor weights, loaded from the same directory. Identity
    # is the point: a parameter the step did not update keeps its loaded bits exactly (no rounding reaches it)
    unchanged = [n for n in before if n.startswith("actor.") and torch.equal(before[n], trained_params[n])]
    assert unchanged == []


@pytest.mark.parametrize("agg", ["trajectory", "token", "seq_sum_norm"])
@pytest.mark.parametrize("algo", ["ppo_epo", "grpo_epo"])
def test_micro_batch_accumulation_equals_full_batch(compose_cfg, algo, agg):
    """batch 1 x accumulation N == N x 1: the same parameters after the update, the same logged losses."""
    base = [f"algo={algo}", f"algo.loss_agg={agg}", *PLAIN_SGD, "total_steps=2"]
    batches = [synthetic_batch(500, seed=1), synthetic_batch(500, seed=2)]  # step 2 has an entropy window
    results = []
    for micro in (64, 1, 3):
        cfg = compose_cfg(*base, "algo.micro_batch_tokens=null", f"algo.micro_batch_size={micro}")
        module, trainer = fit_one_step(cfg, batches)
        results.append((params(module), {k: float(v) for k, v in trainer.callback_metrics.items()}))
    (p_full, m_full), *others = results
    assert "loss/smooth" in m_full  # the second step used L_smooth
    for p, m in others:
        for name in p_full:
            assert torch.allclose(p_full[name], p[name], atol=1e-6, rtol=1e-4), name
        for key in ("loss/policy", "loss/entropy", "loss/smooth", "loss/total"):  # GRPO's policy loss is ~0: its
            assert m[key] == pytest.approx(m_full[key], rel=1e-5, abs=1e-6), key  # float32 rounding ~1e-7, by order


def test_missing_epo_callbacks_fail_with_a_clear_message(compose_cfg):
    cfg = compose_cfg("algo=ppo_epo")
    module = hydra.utils.instantiate(cfg.module)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, limit_train_batches=1)
    with pytest.raises(RuntimeError, match="callbacks=default"):
        trainer.fit(module, train_dataloaders=DataLoader([synthetic_batch(100)], batch_size=None, collate_fn=lambda b: b))


def test_target_kl_stops_the_update_at_the_first_mini_batch_past_it(compose_cfg):
    """The first mini-batch sees the old policy (KL 0) and steps; with a tiny target the next one stops the
    update unapplied. A target that is never reached changes nothing."""
    base = ["algo=ppo_epo", "algo.ppo_epochs=4", "algo.mini_batches=2", "optim.actor_lr=1e-2", "optim.warmup_ratio=0"]
    batch = synthetic_batch(500, seed=3)
    runs = {}
    for target in ("null", "1e-9", "1e9"):
        module, trainer = fit_one_step(compose_cfg(*base, f"algo.target_kl={target}"), [batch])
        runs[target] = (params(module), {k: float(v) for k, v in trainer.callback_metrics.items()})
    (free, free_m), (tight, tight_m), (loose, loose_m) = runs["null"], runs["1e-9"], runs["1e9"]
    assert "ppo/optimizer_steps" not in free_m
    assert tight_m["ppo/optimizer_steps"] == 1 and loose_m["ppo/optimizer_steps"] == 8
    assert tight_m["ppo/approx_kl"] > 0
    # two runs (with and without a KL check): alike within float32 rounding (rel 1e-5, abs 1e-6); one AdamW step
    # instead of eight moves a parameter by ~lr = 1e-2 per step
    for n in free:
        torch.testing.assert_close(loose[n], free[n], rtol=1e-5, atol=1e-6, msg=n)
    moved = [n for n in free if n.startswith("actor.") and not torch.allclose(free[n], tight[n], rtol=1e-5, atol=1e-6)]
    assert moved, "one optimizer step is not eight"


@pytest.mark.parametrize("bad", ["0", "-0.1", "true", "'x'"])
def test_target_kl_must_be_positive(compose_cfg, bad):
    from lightning_epo.core.errors import ConfigError
    from lightning_epo.runtime.config import validate

    with pytest.raises(ConfigError, match="algo.target_kl must be a number > 0"):
        validate(compose_cfg("algo=ppo", f"algo.target_kl={bad}"))


def test_gae_unit_is_checked_at_start(compose_cfg):
    from lightning_epo.core.errors import ConfigError
    from lightning_epo.runtime.config import validate

    with pytest.raises(ConfigError, match="algo.gae.unit='step' is not valid; choose one of: turn, token"):
        validate(compose_cfg("algo=ppo", "algo.gae.unit=step"))


def test_critic_explained_variance_is_logged_for_ppo_only(compose_cfg):
    batch = synthetic_batch(vocab=64)
    _, ppo = fit_one_step(compose_cfg("algo=ppo"), [batch])
    assert torch.isfinite(ppo.callback_metrics["critic/explained_variance"])
    assert {"critic/value_mean", "critic/return_mean"} <= ppo.callback_metrics.keys()
    _, grpo = fit_one_step(compose_cfg("algo=grpo"), [batch])
    assert not any(name.startswith("critic/") for name in grpo.callback_metrics)


def test_evaluation_metrics_live_on_the_modules_device(compose_cfg):
    """ZeRO-3 moves only the parameters to the GPU, not the module's metric states: their all-rank sync then
    gathered CPU tensors over NCCL (gpu-check, 2026-11-25: trainer=deepspeed_stage_3 died at its first evaluation).
    The meta device stands in for the GPU."""
    module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo").module)
    module._device = torch.device("meta")
    module.on_validation_epoch_start()
    states = [state for metric in module.val_metrics.values() for state in metric.metric_state.values()]
    assert states and all(state.device.type == "meta" for state in states)


def test_evaluation_logs_the_invalid_action_share_and_the_answer_length_per_turn(compose_cfg, monkeypatch):
    """``val/<split>/invalid_action_rate``, ``val/<split>/format_error_rate`` and ``val/<split>/response_tokens`` are
    means over the split's turns (an episode of 3 turns weighs 3x one of 1): a zero-shot evaluation of a real model
    reports how often it writes no valid action, how often no answer in the format, and how long its answers are."""
    module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo").module)
    logged = {}
    monkeypatch.setattr(module, "log", lambda name, metric, **kwargs: logged.__setitem__(name, metric))

    def turn(tokens: int, valid: bool, format_ok: bool = True) -> TurnSample:
        return TurnSample(prompt_ids=[1], response_ids=[2] * tokens, traj_id=0, turn_idx=0, group_id=0,
                          action_valid=valid, format_ok=format_ok)
    episodes = [Episode(0, 0, "task", turns=[turn(4, False, format_ok=False), turn(6, True), turn(8, False)]),
                Episode(1, 1, "task", turns=[turn(2, True)])]
    module.validation_step(EvalBatch("iid", episodes), 0)
    assert float(logged["val/iid/invalid_action_rate"].compute()) == pytest.approx(2 / 4)
    assert float(logged["val/iid/format_error_rate"].compute()) == pytest.approx(1 / 4)
    assert float(logged["val/iid/response_tokens"].compute()) == pytest.approx((4 + 6 + 8 + 2) / 4)
    assert float(logged["val/iid/turns"].compute()) == pytest.approx(2.0)


def test_evaluation_logs_the_episode_count_of_each_split_summed_over_its_batches(compose_cfg, tmp_path):
    """``val/<split>/episodes`` reaches ``trainer.validate``'s results (what mode=eval writes into eval.json) and the
    loggers: the count each success rate's 95 % interval is over (lightning_epo/reports/summary.py)."""
    module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo").module)

    def batch(split: str, episodes: int) -> EvalBatch:
        turn = TurnSample(prompt_ids=[1], response_ids=[2], traj_id=0, turn_idx=0, group_id=0)
        return EvalBatch(split, [Episode(i, i, "task", turns=[turn]) for i in range(episodes)])

    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    batches = [batch("iid", 3), batch("iid", 2), batch("ood", 4)]
    (results,) = trainer.validate(module, DataLoader(batches, batch_size=None, collate_fn=lambda b: b), verbose=False)
    assert results["val/iid/episodes"] == 5.0 and results["val/ood/episodes"] == 4.0


@pytest.mark.parametrize(("algo", "mini_batches"),
                         [("ppo_epo", 1), ("ppo_epo", 2), ("grpo_epo", 1), ("grpo_epo", 2), ("sft", 1)])
def test_the_update_gives_the_old_policy_of_the_rows_it_reaches_before_its_first_optimizer_step(
        compose_cfg, algo, mini_batches, monkeypatch):
    """The first mini-batch's forward runs on the rollout's policy, so its detached log-probs and entropies are the
    old policy's: the old-policy pass leaves those rows to it (every row with one mini-batch, the default: no actor
    pass at all), with the same parameters, losses, entropy panels and entropy window as the pass over every row."""
    import lightning_epo.training.micro_batches as micro_batches

    base = [f"algo={algo}", "algo.ppo_epochs=2", f"algo.mini_batches={mini_batches}", *PLAIN_SGD, "total_steps=2"]
    batches = [synthetic_batch(500, seed=1), synthetic_batch(500, seed=2)]  # step 2 has an entropy window (EPO)
    left, left_trainer = fit_one_step(compose_cfg(*base), batches)
    monkeypatch.setattr(micro_batches, "update_fills", lambda minis, shaped, reads_old: 0)  # the pass does all
    passed, passed_trainer = fit_one_step(compose_cfg(*base), batches)
    assert ("old_logprob" in left.clock.seconds) == (mini_batches > 1) and "old_logprob" in passed.clock.seconds
    for name, value in params(passed).items():
        torch.testing.assert_close(params(left)[name], value, atol=1e-6, rtol=1e-5, msg=name)
    metrics = {k: float(v) for k, v in passed_trainer.callback_metrics.items() if k.split("/")[0] in ("loss", "entropy")}
    assert any(k.startswith("entropy/") for k in metrics) and "loss/policy" in metrics
    for name, value in metrics.items():
        assert float(left_trainer.callback_metrics[name]) == pytest.approx(value, abs=1e-5), name
    (window,), (passed_window,) = ([c for c in t.callbacks if isinstance(c, EntropyWindow)]
                                   for t in (left_trainer, passed_trainer))
    assert window.values == pytest.approx(passed_window.values, abs=1e-6) and len(window.values) == 2


def test_a_supervised_step_has_no_old_policy_pass_with_several_mini_batches(compose_cfg, monkeypatch):
    """The nll loss (``algo=sft``) reads no old log-probs: with 3 mini-batches and 2 epochs the actor has no
    old-policy pass, every row's first forward fills its log-probs and entropies (a zero left on a response token
    would pull the entropy panels down), and the parameters are those of the pass over every row."""
    import lightning_epo.training.micro_batches as micro_batches

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # each step's old entropies [N, L] and response mask [N, L]
    real_check = module_lib.old_policy_not_finite

    def spy(old, mask, reduce):
        seen.append((old["entropy"].clone(), mask.clone()))
        return real_check(old, mask, reduce)

    monkeypatch.setattr(module_lib, "old_policy_not_finite", spy)
    base = ["algo=sft", "algo.ppo_epochs=2", "algo.mini_batches=3", *PLAIN_SGD, "total_steps=1"]
    batches = [synthetic_batch(500, seed=4, trajectories=6)]
    left, _ = fit_one_step(compose_cfg(*base), batches)
    monkeypatch.setattr(micro_batches, "update_fills", lambda minis, shaped, reads_old: 0)  # the pass does all
    passed, _ = fit_one_step(compose_cfg(*base), batches)
    assert "old_logprob" not in left.clock.seconds and "old_logprob" in passed.clock.seconds
    for name, value in params(passed).items():
        torch.testing.assert_close(params(left)[name], value, atol=1e-6, rtol=1e-5, msg=name)
    (filled, mask), (from_pass, _) = seen
    assert bool((filled[mask.bool()] > 0).all())  # every response token's entropy was written by the update
    torch.testing.assert_close(filled.sum() / mask.sum(), from_pass.sum() / mask.sum(), rtol=0.05, atol=0.0)


def test_the_step_logs_how_far_the_engines_log_probs_are_from_the_trainers(compose_cfg):
    """``train/sampler_logprob_gap``: the mean over response tokens of |engine log-prob - old log-prob|, from the
    old-policy pass and the update's first forward alike (two mini-batches); not logged without engine log-probs."""
    from lightning_epo.models.policy_outputs import actor_token_outputs

    cfg = compose_cfg("algo=grpo_epo", "algo.mini_batches=2", "total_steps=1")
    module = hydra.utils.instantiate(cfg.module)
    module.configure_model()  # the policy fit_one_step starts from
    batch = synthetic_batch(500, seed=3)
    mask = batch.response_mask
    with torch.no_grad():
        old, _ = actor_token_outputs(module.actor, batch.input_ids, batch.attention_mask, mask)
    offsets = torch.where(torch.arange(mask.shape[1]) % 2 == 0, 0.3, -0.1).expand_as(old) * mask
    batch.sampler_logprobs = old + offsets
    _, trainer = fit_one_step(cfg, [batch])
    expected = float(offsets.abs()[mask].mean())
    assert float(trainer.callback_metrics["train/sampler_logprob_gap"]) == pytest.approx(expected, abs=1e-4)
    assert 0.1 < expected < 0.3  # both offsets counted, token-weighted

    _, without = fit_one_step(cfg, [synthetic_batch(500, seed=3)])
    assert "train/sampler_logprob_gap" not in without.callback_metrics and "loss/policy" in without.callback_metrics


@pytest.mark.parametrize(("overrides", "logged"), [(["algo=grpo_epo"], True),
                                                   (["algo=grpo_epo", "algo.epo.smoothing=false"], True),
                                                   (["algo=grpo"], False)])
def test_the_window_mean_and_the_share_outside_the_band_are_logged_wherever_the_entropy_term_is_on(
        compose_cfg, overrides, logged):
    """EPO with or without its smoothing (EPO-Base, the bare bonus) logs H̄ and the share of tokens outside
    ``[κ_l, κ_r]·H̄`` from step 1 (what a comparison of the two reads); without the entropy term nothing ``epo/``."""
    _, trainer = fit_one_step(compose_cfg(*overrides, "total_steps=2"), [synthetic_batch(500, seed=1),
                                                                         synthetic_batch(500, seed=2)])
    metrics = trainer.callback_metrics
    assert ({"epo/entropy_ref", "epo/out_of_range_frac"} <= metrics.keys()) is logged
    assert ("epo/beta" in metrics) is ("algo.epo.smoothing=false" not in overrides and logged)
    if logged:
        assert 0.0 <= float(metrics["epo/out_of_range_frac"]) <= 1.0 and float(metrics["epo/entropy_ref"]) > 0
