"""A DeepSpeed ZeRO strategy from a few flags, on GPUs or on CPU processes with gloo (``trainer=deepspeed_stage_2|3``);
whether this machine can run it is checked at start by :func:`lightning_epo.runtime.config.check_machine`."""

from __future__ import annotations

import argparse
from typing import Any

from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from lightning.pytorch.strategies.deepspeed import remove_module_hooks

from lightning_epo.core.errors import ConfigError


def deepspeed_config(
    stage: int,
    precision: str,
    gradient_clipping: float,
    offload_optimizer: bool = False,
    offload_parameters: bool = False,
    pin_memory: bool = True,
    bucket_size: int = 200_000_000,
) -> dict[str, Any]:
    """The DeepSpeed config dict (https://www.deepspeed.ai/docs/config-json/).

    - ``gradient_clipping`` lives here: DeepSpeed clips (over all parameters) inside ``engine.step()``,
      where Lightning's ``gradient_clip_val`` and the module's own per-group clipping do not reach.
    - bf16 keeps fp32 master weights in the ZeRO optimizer; ``check_grad_overflow`` makes DeepSpeed skip a
      step whose gradients are not finite (the module counts it in ``train/skipped_steps``).
    - ``offload_optimizer`` (stage 2 or 3) keeps optimizer state and the update on the CPU;
      ``offload_parameters`` (stage 3) keeps the parameter shards there too.
    - ``train_micro_batch_size_per_gpu`` only feeds DeepSpeed's throughput log (one batch = one RL step);
      ``gradient_accumulation_steps`` is Lightning's (1): the module marks its own accumulation boundaries.
    """
    if stage not in (2, 3):
        raise ConfigError(f"trainer.strategy.stage={stage} is not valid; choose 2 or 3")
    if offload_parameters and stage != 3:
        raise ConfigError("trainer.strategy.offload_parameters needs ZeRO stage 3: use trainer=deepspeed_stage_3")
    zero = _zero_optimization(stage, bucket_size)
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if offload_parameters:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    config: dict[str, Any] = {
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": gradient_clipping,
        "train_micro_batch_size_per_gpu": 1,
    }
    if precision.startswith("bf16"):
        config["bf16"] = {"enabled": True, "check_grad_overflow": True}
    return config


def _zero_optimization(stage: int, bucket_size: int) -> dict[str, Any]:
    """The ``zero_optimization`` section of ZeRO ``stage`` (2 or 3), its communication buckets ``bucket_size``."""
    zero: dict[str, Any] = {
        "stage": stage,
        "contiguous_gradients": True,
        "overlap_comm": True,
        "reduce_bucket_size": bucket_size,
    }
    if stage == 2:
        zero.update(allgather_bucket_size=bucket_size, reduce_scatter=True)
    else:
        zero.update(stage3_prefetch_bucket_size=bucket_size, stage3_param_persistence_threshold=100_000)
    return zero


class ZeroStrategy(DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` with one DeepSpeed engine at a time on the model.

    A ``trainer.validate`` before ``trainer.fit`` (``val_at_start``) wraps the module in DeepSpeed's inference
    engine, which under ZeRO-3 hooks every submodule to gather and release its shards. ``fit`` then wraps the same
    module in a training engine whose hooks would run beside the first's (Lightning issue #17523: Lightning removes
    hooks before building an inference engine, not before a training one): every forward gathered twice. The
    inference engine is destroyed (``DeepSpeedEngine.destroy`` removes its hooks) before the training one is built.
    A ZeRO-3 checkpoint loads into the inference engine (:meth:`load_checkpoint`).
    """

    _inference_engine: Any = None

    def _initialize_deepspeed_inference(self, model) -> None:
        super()._initialize_deepspeed_inference(model)
        self._inference_engine = self.model

    def _initialize_deepspeed_train(self, model) -> None:
        if self._inference_engine is not None:
            self._inference_engine.destroy()
            self._inference_engine = None
        super()._initialize_deepspeed_train(model)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict[str, Any]:
        """As Lightning's, and under ZeRO-3 into the inference engine too (``mode=eval``): DeepSpeed 0.19.8 loads the
        checkpoint's consolidated weights into the module (``load_optimizer_states=False``), then has the engine's
        optimizer rebuild its fp32 master weights from them, which an engine without optimizer lacks (its
        parameter offloader has no ``_restore_from_bit16_weights``): it has no master weights to rebuild."""
        engine = self.deepspeed_engine
        if engine is self._inference_engine and self.zero_stage_3:
            engine.optimizer._restore_from_bit16_weights = lambda: None
        return super().load_checkpoint(checkpoint_path, weights_only)


class CPUDeepSpeedStrategy(ZeroStrategy):
    """:class:`ZeroStrategy` on CPU processes (gloo), for ``trainer.accelerator=cpu``.

    DeepSpeed picks its CPU accelerator by itself when there is no CUDA; its shared-memory communication op is
    not built (:func:`skip_shared_memory_op`). Lightning refuses CPU in three places, overridden here: the CUDA check of
    ``setup_environment``, the device-index check of ``setup_distributed`` (CPU devices have no index), and
    ``device_rank=root_device.index`` given to ``deepspeed.initialize`` for training and for inference (None on
    CPU, which DeepSpeed cannot compare; any rank >= 0 makes it take the process group's world size and rank,
    and the CPU as device).
    """

    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # DeepSpeedStrategy's parent's, without its CUDA check

    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        skip_shared_memory_op()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        engine, deepspeed_optimizer, _, _ = self._deepspeed_initialize(
            config=self.config,
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
        )
        return engine, deepspeed_optimizer

    def _initialize_deepspeed_inference(self, model) -> None:
        """Lightning 2.6.6's inference engine (``trainer.validate``, ``mode=eval``) with the CPU's device rank."""
        config = {"train_micro_batch_size_per_gpu": 1}
        config.update({key: self.config[key] for key in ("fp16", "bf16") if key in self.config})
        if self.zero_stage_3:
            config.update({key: self.config[key] for key in ("zero_allow_untested_optimizer", "zero_optimization")})
        remove_module_hooks(model)
        engine = self._deepspeed_initialize(config=config, model=model, model_parameters=[])[0]
        self.model = self._inference_engine = engine

    def _deepspeed_initialize(self, **kwargs):
        import deepspeed

        device_rank = argparse.Namespace(device_rank=self.local_rank)
        return deepspeed.initialize(args=device_rank, dist_init_required=False, **kwargs)


def skip_shared_memory_op() -> None:
    """Keeps DeepSpeed 0.19.8's CPU backend from building its shared-memory all-reduce (``deepspeed_shm_comm``).

    ``TorchBackend`` JIT-builds it with g++ as DeepSpeed starts (about a minute the first time), for
    ``inference_all_reduce`` only (DeepSpeed-Inference's tensor parallelism), which training never calls. A build
    killed midway leaves torch's lock file in the extensions directory, on which every later start waits forever
    (``FileBaton`` has no timeout). With the op marked incompatible in ``deepspeed.ops.__compatible_ops__`` (one dict,
    whose edits DeepSpeed keeps), ``build_shm_op`` returns None and every collective goes through gloo."""
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def deepspeed_strategy(stage: int, precision: str, gradient_clipping: float, accelerator: str = "gpu", **options: Any):
    """:class:`ZeroStrategy` with :func:`deepspeed_config` (``trainer=deepspeed_stage_2|3``);
    :class:`CPUDeepSpeedStrategy` when ``accelerator`` is ``cpu``."""
    strategy = CPUDeepSpeedStrategy if accelerator == "cpu" else ZeroStrategy
    return strategy(config=deepspeed_config(stage, precision, gradient_clipping, **options))
