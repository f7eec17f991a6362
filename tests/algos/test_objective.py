import math

import pytest
import torch

from lightning_epo.algos import sequence_sum_weights, token_mean_weights, trajectory_weights
from lightning_epo.algos.objective import ObjectiveSettings, StepTargets, epo_objective


def test_ratio_diagnostics_are_means_when_the_loss_weights_do_not_sum_to_one():
    """Under Dr. GRPO's aggregation the loss weights sum to (mean turn length) / C; ppo/clipfrac and
    ppo/approx_kl stay shares and means of tokens (mean_weights)."""
    mask = torch.ones(2, 3, dtype=torch.bool)
    logprob = torch.full((2, 3), math.log(2.0))  # ratio 2 against the old policy: every token clipped for A > 0
    targets = StepTargets(
        old_logprobs=torch.zeros(2, 3), advantages=torch.ones(2, 3), pg_weights=sequence_sum_weights(mask, scale=512),
        traj_weights=trajectory_weights(mask, torch.tensor([0, 1])), mean_weights=token_mean_weights(mask),
    )
    settings = ObjectiveSettings(entropy_coef=0.0, beta=0.0, entropy_ref=None, smoothing=False)
    _, terms = epo_objective(logprob, torch.zeros(2, 3), None, targets, settings)
    assert terms["clipfrac"].item() == pytest.approx(1.0)
    assert terms["approx_kl"].item() == pytest.approx(1.0 - math.log(2.0))
    assert terms["policy"].item() == pytest.approx(-1.2 * 3 / 512)  # each turn's token sum of -clip(r) A over C


def test_the_objective_settings_read_every_fixed_field_from_the_config_by_name(compose_cfg):
    """No field is copied by hand: each of the objective's run-fixed settings is the config's own value (EPO's under
    algo.epo, the rest under algo), so a setting added to ObjectiveSettings cannot be silently left at its default."""
    overrides = {"epo.kappa_l": 0.3, "epo.kappa_r": 1.7, "epo.alpha": 0.21, "epo.penalty": "indicator",
                 "policy_loss": "nll", "clip_low": 0.11, "clip_high": 0.27, "dual_clip": 3.5, "value_coef": 0.7,
                 "value_clip": 0.4, "kl_coef": 0.02, "kl_estimator": "k2"}
    cfg = compose_cfg("algo=ppo_epo", *(f"algo.{key}={value}" for key, value in overrides.items()))
    settings = ObjectiveSettings.from_algo(cfg.algo)
    assert {key: getattr(settings, key.split(".")[-1]) for key in overrides} == overrides
    assert (settings.entropy_coef, settings.beta, settings.entropy_ref, settings.smoothing) == (0.0, 0.0, None, True)
    assert not ObjectiveSettings.from_algo(compose_cfg("algo=ppo_epo", "algo.epo.smoothing=false").algo).smoothing
