"""``model.shared_prefix`` and ``model.fold_turns`` (on by default for the CPU-sized models) in the module: the
old-policy pass and one RL step's update give what the plain forward (both off) gives, and under ZeRO-3 the ranks agree on whether to share a prefix (each way
runs the decoder a different number of times, and every ZeRO-3 forward all-gathers)."""

from __future__ import annotations

from types import SimpleNamespace

import hydra
import pytest
import torch

from lightning_epo.rollout.batch import collate_episodes
from tests.distributed.ddp_worker import SHARED_PREFIX as SHARED
from tests.training.test_micro_batch_tokens import SGD, cut_by_rows
from tests.training.test_module import fit_one_step, params, synthetic_batch, with_history, with_prompt_prefix

PLAIN = ["model.shared_prefix=false", "model.fold_turns=false"]
SHARINGS = {"prefix": ["model.shared_prefix=true", "model.fold_turns=false"],
            "fold": ["model.shared_prefix=false", "model.fold_turns=true"],
            "prefix+fold": ["model.shared_prefix=true", "model.fold_turns=true"]}


def prefixed_batch(vocab: int, seed: int):
    """``synthetic_batch`` with :data:`SHARED` put before every prompt, each turn's prompt carrying the earlier
    turns (so an episode's earlier rows begin its later ones)."""
    episodes = with_prompt_prefix(with_history(synthetic_batch(vocab, seed=seed, trajectories=8).episodes), SHARED)
    return collate_episodes(episodes, pad_token_id=0, stats={"train/reward": 1.0})


def count_folded(monkeypatch) -> list[int]:
    """Record how many rows :func:`prefix_hosts` gives another row as host, call by call."""
    import lightning_epo.training.micro_batches as module_lib

    folded, hosts_of = [], module_lib.prefix_hosts

    def recording(*args):
        hosts = hosts_of(*args)
        folded.append(int((hosts != torch.arange(len(hosts))).sum()))
        return hosts
    monkeypatch.setattr(module_lib, "prefix_hosts", recording)
    return folded


@pytest.mark.parametrize("sharing", SHARINGS)
def test_old_policy_pass_gives_the_same_logprobs_entropies_values_and_reference(compose_cfg, monkeypatch, sharing):
    torch.manual_seed(0)  # the critic's head is drawn from torch's initial seed
    folded, outputs = count_folded(monkeypatch), []
    for overrides in (PLAIN, SHARINGS[sharing]):
        module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo", "algo.kl_coef=0.1", *cut_by_rows(5),
                                                     *overrides).module)
        module.configure_model()
        monkeypatch.setattr(module, "_reduce", lambda t, op="sum": t)  # one process, no trainer
        batch = prefixed_batch(module.actor.config.vocab_size, seed=4)
        outputs.append(module._old_policy_pass(batch, torch.arange(0)))
    (plain, shared), real = outputs, batch.attention_mask.bool()
    assert ("fold" not in sharing) or (folded and min(folded) > 0)  # every micro-batch had rows to fold
    assert plain.keys() == shared.keys() == {"old_logprobs", "entropy", "old_values", "ref_logprobs"}
    for name in plain:  # float32 rounding of a value near 0 is relative to the largest (values reach ~4)
        scale = plain[name][real].abs().max().item()
        torch.testing.assert_close(shared[name][real], plain[name][real], atol=2e-6 * scale, rtol=1e-5, msg=name)


@pytest.mark.parametrize("sharing", ["prefix", "prefix+fold"])
@pytest.mark.parametrize("variant", [["algo=ppo_epo", *cut_by_rows(3)], ["algo=grpo_epo", *cut_by_rows(3)],
                                     ["algo=ppo_epo", "model.lora.r=4", *cut_by_rows(3)],
                                     ["algo=ppo_epo", "algo.micro_batch_tokens=60"]],
                         ids=["ppo_epo", "grpo_epo", "ppo_epo-lora", "ppo_epo-tokens"])
def test_parameters_after_one_update_match_the_plain_forward(compose_cfg, monkeypatch, variant, sharing):
    """Two PPO epochs of two mini-batches, several micro-batches each (actor, critic; LoRA adapters)."""
    import lightning_epo.training.micro_batches as module_lib

    base = [*variant, "algo.ppo_epochs=2", "algo.mini_batches=2", *SGD]
    batches = [prefixed_batch(500, seed=5)]
    prefixes, measure = [], module_lib.shared_prefix_length
    monkeypatch.setattr(module_lib, "shared_prefix_length", lambda *a: prefixes.append(measure(*a)) or prefixes[-1])
    folded, results = count_folded(monkeypatch), []
    for overrides in (PLAIN, SHARINGS[sharing]):
        module, trainer = fit_one_step(compose_cfg(*base, *overrides), batches)
        results.append((params(module), {k: float(v) for k, v in trainer.callback_metrics.items()}))
    assert prefixes and min(prefixes) >= len(SHARED)  # every micro-batch of the second run shared its prefix
    assert ("fold" not in sharing) or sum(folded) > 0
    (plain_p, plain_m), (shared_p, shared_m) = results
    for name, value in plain_p.items():
        torch.testing.assert_close(shared_p[name], value, atol=1e-6, rtol=1e-5, msg=name)
    for key in ("loss/policy", "loss/entropy", "loss/total"):
        assert shared_m[key] == pytest.approx(plain_m[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize(("stage", "other_rank_shares", "expected"), [(3, False, 0), (3, True, 6), (2, False, 6)])
def test_under_zero3_a_prefix_is_used_only_where_every_rank_has_one(compose_cfg, monkeypatch, stage, other_rank_shares,
                                                                     expected):
    import lightning_epo.training.module as module_lib

    module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo", "model.shared_prefix=true").module)
    batch = prefixed_batch(500, seed=4)
    rows = batch.select(torch.arange(4))
    monkeypatch.setattr(module_lib, "zero_stage", lambda strategy: stage)
    monkeypatch.setattr(module, "_trainer", SimpleNamespace(strategy=None))
    monkeypatch.setattr(module, "_reduce", lambda t, op="sum": torch.minimum(t, torch.tensor(int(other_rank_shares)))
                        if op == "min" else pytest.fail(op))
    assert module._sharing(rows).prefix == expected
