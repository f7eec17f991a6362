"""How large the entropy term's gradient is against the policy-gradient term's, at an RL step's first optimizer step.

EPO's loss is ``L_MT - lambda [L_H - beta_k L_smooth]`` (Eq. 8); what ``lambda`` does depends on how large L_H's
gradient is next to L_MT's, which depends on the advantages' scale (std-normalised GRPO about +-1, Dr. GRPO and PPO's
GAE the rewards' own, here up to 10). This runs one RL step of ``train.py`` with the given overrides and, over every
micro-batch of the step's first mini-batch (the gradient of its first optimizer step), sums the gradients of the two
terms with respect to the trainable parameters:

- ``g_pg``: of L_MT, the policy-gradient term (Eq. 3, the configured policy loss and aggregation);
- ``g_h``: of L_H, the trajectory-aware entropy (Eq. 5) at lambda = 1 (no smoothing at the first step: it needs a
  previous step's entropy).

It prints ``|g_pg|``, ``|g_h|``, their cosine, the advantages' token-weighted RMS over the same tokens, the share
``lambda |g_h| / |g_pg|`` at the run's lambda (``algo.entropy_coef``), and the lambda at which the share is
``--share``.

    python benchmarks/entropy_gradient_share.py [--share 0.1] [KEY=VALUE ...]   # train.py's overrides
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from bench_utils import machine_line

import lightning_epo.training.module as module_lib
from lightning_epo.algos.aggregation import weighted_sum
from lightning_epo.algos.losses import POLICY_LOSSES
from lightning_epo.runtime.run import run
from lightning_epo.runtime.warm_start import compose_config


class FirstStepGradients:
    """Wraps ``epo_objective`` and ``EPOModule._accumulate``: until the first optimizer step, adds each micro-batch's
    gradients of L_MT and L_H (``[P]`` flattened over the actor's trainable parameters) to :attr:`sums`, and the
    token-weighted sums of A^2 and of the weights (``mean_weights``) to :attr:`advantage_sums` (the advantages' RMS)."""

    def __init__(self) -> None:
        self.sums = {"pg": None, "h": None}
        self.advantage_sums = [0.0, 0.0]
        self.module, self.done = None, False
        self.objective, self.accumulate = module_lib.epo_objective, module_lib.EPOModule._accumulate
        register_optimizer_step_pre_hook(lambda *_: setattr(self, "done", True))
        module_lib.epo_objective = self.objective_with_gradients

        def accumulate(module, *args, **kwargs):  # an EPOModule method: the module the gradients are taken in
            self.module = module
            return self.accumulate(module, *args, **kwargs)

        module_lib.EPOModule._accumulate = accumulate

    def objective_with_gradients(self, logprob, entropy, values, targets, s):
        if not self.done:
            pg_tok, _ = POLICY_LOSSES.get(s.policy_loss)(logprob, targets.old_logprobs, targets.advantages,
                                                          s.clip_low, s.clip_high, s.dual_clip)
            self.advantage_sums[0] += float(weighted_sum(targets.advantages.square(), targets.mean_weights))
            self.advantage_sums[1] += float(targets.mean_weights.sum())
            params = [p for p in self.module.actor.parameters() if p.requires_grad]
            for name, term in (("pg", weighted_sum(pg_tok, targets.pg_weights)),
                               ("h", weighted_sum(entropy, targets.traj_weights))):
                grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
                flat = torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)])
                self.sums[name] = flat if self.sums[name] is None else self.sums[name] + flat
        return self.objective(logprob, entropy, values, targets, s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--share", type=float, default=0.1, help="the share |lambda g_h| / |g_pg| to calibrate to")
    parser.add_argument("overrides", nargs="*", help="train.py's overrides (the experiment, the warm start's policy)")
    args = parser.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose_config([*args.overrides, "stop_at_step=1", "test_every=1000", "val_at_start=false",
                              "logger=csv", f"run_dir={run_dir}"])
        gradients = FirstStepGradients()
        run(cfg, overrides=list(args.overrides))
    g_pg, g_h = gradients.sums["pg"], gradients.sums["h"]
    ratio = float(g_h.norm() / g_pg.norm())
    lam = float(cfg.algo.entropy_coef)
    print(json.dumps({
        "overrides": args.overrides, "grad_pg_norm": float(g_pg.norm()), "grad_h_norm": float(g_h.norm()),
        "cosine": float(torch.nn.functional.cosine_similarity(g_pg, g_h, dim=0)),
        "advantage_rms": (gradients.advantage_sums[0] / gradients.advantage_sums[1]) ** 0.5,
        "entropy_coef": lam, "share_at_entropy_coef": lam * ratio,
        f"entropy_coef_for_share_{args.share}": args.share / ratio,
    }, indent=1))


if __name__ == "__main__":
    main()
