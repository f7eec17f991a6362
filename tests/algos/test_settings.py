"""The algorithm's typed settings (algos/settings.py): every shipped algo config fits them, they give the start-time
rules of their keys, and the objective reads its settings from their fields."""

from __future__ import annotations

import typing
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_epo.algos.objective import ObjectiveSettings
from lightning_epo.algos.settings import AlgoConfig, EpoConfig
from lightning_epo.core.errors import ConfigError
from lightning_epo.core.rules import rules_of
from lightning_epo.runtime.config import RULES, validate

ALGOS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "algo").glob("*.yaml"))


@pytest.mark.parametrize("algo", ALGOS)
def test_every_shipped_algo_config_is_an_algo_config(compose_cfg, algo):
    """Merged into AlgoConfig, each shipped algo keeps its values, typed (an integer written for a float reads as one)."""
    cfg = compose_cfg(f"algo={algo}", "algo.clip_high=1")
    typed = OmegaConf.merge(OmegaConf.structured(AlgoConfig), OmegaConf.to_container(cfg.algo, resolve=True))
    assert not OmegaConf.missing_keys(typed)
    assert typed.clip_high == 1.0 and isinstance(typed.clip_high, float)
    assert OmegaConf.to_container(typed) | {"clip_high": 1} == OmegaConf.to_container(cfg.algo, resolve=True) | {
        "gigpo": cfg.algo.get("gigpo"), "clip_high": 1}
    validate(cfg)


def test_the_rules_of_the_algo_keys_are_the_typed_settings_rules():
    algo_rules = {key: rule for key, rule in RULES.items() if key.startswith("algo.")}
    assert algo_rules == rules_of(AlgoConfig, "algo")
    assert {"algo.clip_low", "algo.epo.kappa_r", "algo.gigpo.step_weight", "algo.advantage_shaping.kappa",
            "algo.policy_loss", "algo.epo.penalty"} <= set(algo_rules)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["+algo.clip=0.1"], "algo.clip is not a setting of any algorithm"),
        (["+algo.epo.smooth=true"], "algo.epo.smooth is not a setting of any algorithm"),
        (["~algo.clip_low"], "algo.clip_low is not set: give it a value"),
        (["algo=gigpo", "algo.gigpo=5"], "algo.gigpo does not have the type lightning_epo/algos/settings.py gives it"),
        (["algo.policy_loss=ppo"], "algo.policy_loss='ppo' is not valid; choose one of: clipped, nll"),
    ],
)
def test_an_algo_key_outside_the_typed_settings_is_refused_in_one_line(compose_cfg, overrides, expected):
    with pytest.raises(ConfigError) as error:
        validate(compose_cfg(*overrides))
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


def test_the_objective_settings_are_fields_of_the_typed_settings_with_their_types():
    """ObjectiveSettings reads its run-fixed fields by name from algo.epo or algo: each is a field there, of the
    same type, so a renamed key cannot leave the objective at a default."""
    per_step = {"entropy_coef", "beta", "entropy_ref", "smoothing"}
    epo, algo = typing.get_type_hints(EpoConfig), typing.get_type_hints(AlgoConfig)
    objective = typing.get_type_hints(ObjectiveSettings)
    for field in fields(ObjectiveSettings):
        if field.name not in per_step:
            assert objective[field.name] == epo.get(field.name, algo.get(field.name)), field.name
