"""config.validate: bad input fails at start with one line naming the fix."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from lightning_epo.core.errors import ConfigError
from lightning_epo.runtime.config import RULES, check_rules, validate


def test_k1_kl_in_the_loss_is_refused_naming_k2_and_k3(compose_cfg):
    with pytest.raises(ConfigError, match="algo.kl_estimator=k1 .*use k2 .*or k3"):
        validate(compose_cfg("algo=grpo", "algo.kl_coef=0.01", "algo.kl_estimator=k1"))
    for estimator in ("k2", "k3"):
        validate(compose_cfg("algo=grpo", "algo.kl_coef=0.01", f"algo.kl_estimator={estimator}"))


@pytest.mark.parametrize("bad", ["1.0", "0.5", "-3", "true", "'x'"])
def test_dual_clip_must_exceed_one(compose_cfg, bad):
    with pytest.raises(ConfigError, match="algo.dual_clip must be a number > 1"):
        validate(compose_cfg("algo=ppo", f"algo.dual_clip={bad}"))
    validate(compose_cfg("algo=ppo", "algo.dual_clip=3.0"))


def test_loss_agg_is_checked_at_start(compose_cfg):
    with pytest.raises(ConfigError, match="algo.loss_agg='seq' is not valid; choose one of: trajectory, token, seq_sum_norm"):
        validate(compose_cfg("algo=grpo", "algo.loss_agg=seq"))
    with pytest.raises(ConfigError, match="algo.loss_scale_factor must be an integer >= 1"):
        validate(compose_cfg("algo=drgrpo", "algo.loss_scale_factor=0"))


def test_drgrpo_is_grpo_without_std_normalisation_or_length_normalisation(compose_cfg):
    cfg = compose_cfg("algo=drgrpo", "rollout.max_new_tokens=64")
    validate(cfg)
    assert (cfg.algo.advantage, cfg.algo.grpo.norm_by_std, cfg.algo.loss_agg) == ("grpo", False, "seq_sum_norm")
    assert cfg.algo.loss_scale_factor == 64  # C: the generation cap, a constant for the whole run


@pytest.mark.parametrize(
    "override,expected",
    [
        ("data.train_sampling.temperature=-1", "data.train_sampling.temperature must be a number >= 0 (e.g. 1.0; 0 is greedy), got -1"),
        ("data.train_sampling.top_p=0", "data.train_sampling.top_p must be a number in (0, 1], got 0"),
        ("rollout.max_new_tokens=0", "rollout.max_new_tokens must be an integer >= 1, got 0"),
        ("optim.actor_lr=abc", "optim.actor_lr must be a number >= 0 (e.g. 3e-4; 0 freezes the actor), got 'abc'"),
        ("optim.actor_lr=-0.1", "optim.actor_lr must be a number >= 0"),
        ("optim.grad_clip=-1", "optim.grad_clip must be a number > 0, got -1"),
        ("env.val_size=-1", "env.val_size must be an integer >= 1 or null, got -1"),
        ("algo.epo.kappa_r=high", "algo.epo.kappa_r must be a number > 0, got 'high'"),
        ("model.trust_remote_code='false'", "model.trust_remote_code must be true or false (unquoted), got 'false'"),
        ("algo.group_size=3", "data.episodes_per_step=16 is not a multiple of algo.group_size=3"),
        ("algo.epo.window=0", "algo.epo.window must be 'cumulative' or an integer >= 1, got 0"),
        ("algo.epo.beta=-1", "algo.epo.beta must be 'schedule' (Eq. 7) or a number >= 0, got -1"),
        ("algo.epo.kappa_l=3", "algo.epo.kappa_l=3 must be below algo.epo.kappa_r=2.0"),
        ("optim.warmup_ratio=1", "optim.warmup_ratio must be a number in [0, 1), got 1"),
        ("env.suite.wall_density=nan", "env.suite.wall_density must be a number in [0, 1), got nan"),
        ("trainer.devices=-2", "trainer.devices must be 'auto' or an integer >= 1, got -2"),
        ("trainer=ddp trainer.num_nodes=0", "trainer.num_nodes must be an integer >= 1, got 0"),
        ("data.task_order=sorted", "data.task_order='sorted' is not valid; choose one of: random, shuffled"),
        ("rollout=vllm rollout.engine.block_size=0", "rollout.engine.block_size must be an integer >= 1 or null"),
    ],
)
def test_bad_values_are_refused_at_start_naming_the_key(compose_cfg, override, expected):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg("data.episodes_per_step=16", *override.split()))
    assert str(error.value).startswith(expected)


def _numbers_and_switches(node: object, prefix: str = "") -> dict[str, object]:
    """The int / float / bool leaves of an unresolved config container (interpolations are strings), without
    Hydra's own ``_partial_`` / ``_recursive_`` flags."""
    if isinstance(node, dict):
        children = {key: child for key, child in node.items() if not str(key).startswith("_")}
        return {k: v for key, child in children.items() for k, v in _numbers_and_switches(child, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node} if isinstance(node, (int, float)) else {}  # bool is an int


@pytest.mark.parametrize(
    "choice",
    ["experiment=quickstart", "algo=ppo_epo", "algo=grpo_epo", "algo=gigpo_epo", "algo=ppo_ea", "algo=sft",
     "env=sciworld", "env=alfworld", "rollout=vllm", "rollout=expert", "model=qwen2.5-7b", "trainer=deepspeed_stage_3",
     "experiment=gridworld_learn", "experiment=paper_sciworld_ppo_epo", "experiment=smollm2_sciworld"],
)
def test_every_number_and_switch_of_the_configs_has_a_rule_that_accepts_the_shipped_value(compose_cfg, choice):
    cfg = compose_cfg(choice)
    leaves = _numbers_and_switches(OmegaConf.to_container(cfg, resolve=False))
    unchecked = [key for key in leaves if key not in RULES and key != "trainer.devices"]  # 'auto' or a count
    assert not unchecked, f"add a rule to lightning_epo/runtime/config.py RULES for: {unchecked}"
    check_rules(cfg)


@pytest.mark.parametrize(("model", "tokens", "think"), [("tiny", 24, False), ("smollm2-135m", 48, False),
                                                        ("qwen2.5-7b", 512, True)])
@pytest.mark.parametrize("rollout", ["hf", "vllm"])
def test_the_model_sets_the_rollouts_answer_length_and_prompt(compose_cfg, model, tokens, think, rollout):
    """A real model gets an answer length and prompt that suit it (its config's ``answer``), not the tiny model's
    24 tokens; both engines read the same, and the command line still overrides it."""
    cfg = compose_cfg(f"model={model}", f"rollout={rollout}")
    assert (cfg.rollout.max_new_tokens, cfg.rollout.think) == (tokens, think)
    assert cfg.data.train_sampling.max_new_tokens == tokens
    assert compose_cfg(f"model={model}", f"rollout={rollout}", "rollout.max_new_tokens=12").rollout.max_new_tokens == 12


@pytest.mark.parametrize("dropped", ["entropy_window", "beta_schedule"])
def test_an_epo_run_without_its_entropy_window_or_beta_schedule_is_refused_at_start(compose_cfg, dropped):
    """Eq. 6's smoothing reads H̄ and β_k from two callbacks: without either the run used to die at its first RL
    step (a RuntimeError after loading the model and collecting a rollout); now validate says so at start."""
    with pytest.raises(ConfigError, match=f"algo.epo.smoothing=true needs the callback {dropped}"):
        validate(compose_cfg("algo=ppo_epo", f"~callbacks.{dropped}"))
    validate(compose_cfg("algo=ppo", f"~callbacks.{dropped}"))  # no smoothing: neither callback is read


def test_a_run_without_the_weight_sync_is_refused_at_start(compose_cfg):
    """WeightSync is the one route by which the engines get the actor's weights: without it a run is refused at
    start, instead of stopping at its first collection."""
    with pytest.raises(ConfigError, match=r"callbacks\.weight_sync .*keep it"):
        validate(compose_cfg("~callbacks.weight_sync"))


@pytest.mark.parametrize(("native", "precision"), [(True, "bf16-mixed"), (False, "32-true")])
@pytest.mark.parametrize("experiment", ["smollm2_sciworld", "smollm2_sciworld_sft"])
def test_the_smollm2_sciworld_recipe_keeps_sdpa_attention_in_bf16(compose_cfg, monkeypatch, experiment, native,
                                                                   precision):
    """Eager attention (the gridworld recipe's in bf16) on ScienceWorld's rows of 600-1,060 tokens: the warm start of
    16 gold paths a step was killed for memory in its 9th step (19.9 GB resident of 23.5) on a native-bf16 CPU; a
    micro-batch of 5 rows of 1,000 tokens peaks at 13.3 GB with eager, 7.3 with sdpa, in bf16
    (benchmarks/attention_cpu.py). The recipe trains in bf16 where the CPU computes it, with sdpa attention."""
    from lightning_epo.runtime import config

    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: native)
    cfg = compose_cfg(f"experiment={experiment}")
    assert (cfg.trainer.precision, cfg.model.attn_implementation) == (precision, "sdpa")


@pytest.mark.parametrize(("native", "expected"), [(True, ("bf16-mixed", "eager", "bfloat16")),
                                                  (False, ("32-true", "sdpa", "float32"))])
@pytest.mark.parametrize("experiment", ["smollm2_gridworld", "smollm2_gridworld_sft"])
def test_the_smollm2_gridworld_recipe_trains_in_bf16_where_the_cpu_computes_it(compose_cfg, monkeypatch, experiment,
                                                                              native, expected):
    """docs/bf16_eager_cpu.md: bf16 with eager attention passed its rule on a CPU with AMX; where bf16 is emulated
    (AVX2: 0.3-0.7 GFLOP/s) the recipe stays float32. The warm start picks what its RL run picks."""
    from lightning_epo.runtime import config

    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: native)
    cfg = compose_cfg(f"experiment={experiment}")
    assert (cfg.trainer.precision, cfg.model.attn_implementation) == expected[:2]
    if experiment == "smollm2_gridworld":
        assert cfg.rollout.engine.dtype == expected[2]
        float32 = compose_cfg(f"experiment={experiment}", "trainer.precision=32-true")  # one override: all follow
        assert (float32.model.attn_implementation, float32.rollout.engine.dtype) == ("sdpa", "float32")
