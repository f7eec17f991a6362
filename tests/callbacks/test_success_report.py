"""The success report: a line per evaluation, and first and last validation success per split at the end."""

import logging
from types import SimpleNamespace

import torch

from lightning_epo.callbacks import SuccessReport


def evaluate(report, step, metrics, sanity=False):
    trainer = SimpleNamespace(callback_metrics={k: torch.tensor(v) for k, v in metrics.items()}, sanity_checking=sanity,
                              is_global_zero=True)
    report.on_validation_end(trainer, SimpleNamespace(rl_step=step))


def test_reports_first_and_last_evaluation_of_each_split():
    report = SuccessReport()
    evaluate(report, 0, {"val/iid/success": 0.40625, "val/ood/success": 0.1, "val/iid/reward": 3.0})
    evaluate(report, 0, {"val/iid/success": 0.9}, sanity=True)  # Lightning's sanity check is not an evaluation
    evaluate(report, 10, {"val/iid/success": 0.5, "val/ood/success": 0.2})
    evaluate(report, 20, {"val/iid/success": 0.625, "val/ood/success": 0.15})
    assert report.lines() == [
        "val/iid/success 0.41 at RL step 0 -> 0.62 at RL step 20",
        "val/ood/success 0.10 at RL step 0 -> 0.15 at RL step 20",
    ]


def test_each_evaluation_logs_what_it_measured(caplog):
    report = SuccessReport()
    with caplog.at_level(logging.INFO):
        evaluate(report, 10, {"val/ood/success": 0.3125, "val/iid/success": 0.78, "val/iid/reward": 3.0,
                              "train/success": 0.9})
        evaluate(report, 10, {"val/iid/success": 0.9}, sanity=True)
    assert caplog.messages == ["evaluation at RL step 10: val/iid/success 0.78, val/ood/success 0.31"]


def test_a_single_evaluation_reports_nothing():
    report = SuccessReport()
    evaluate(report, 20, {"val/iid/success": 0.5})
    assert report.lines() == []
