"""`ng_train`'s entry into training: the `trainer:` section validated, the output_dir resumed or refused, the ranks
launched, and the recipe of `trainer.algorithm` (GRPO: `nemo_gym.train.grpo`; sft / pretrain:
`nemo_gym.train.supervised`; on_distill: `nemo_gym.train.distill`) run by the one training loop
(`nemo_gym.train.loop.TrainingLoop`). Apart from the recipes, which are siblings: none imports another."""

from __future__ import annotations

import sys

import torch

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import LoadedConfig
from nemo_gym.train import distributed
from nemo_gym.train.config import TrainerConfig, check_algorithm, check_hardware, trainer_config
from nemo_gym.train.distill import OnPolicyDistillRecipe
from nemo_gym.train.grpo import GRPORecipe
from nemo_gym.train.loop import Recipe, TrainingLoop
from nemo_gym.train.output_dir import OVERWRITE_KEY, prepare_output_dir, write_run_config
from nemo_gym.train.stopping import run_stoppable
from nemo_gym.train.supervised import SupervisedRecipe, check_supervised

__all__ = ["make_recipe", "make_trainer", "train_main"]


def train_main(loaded: LoadedConfig, argv: list[str]) -> int:
    """`ng_train`: validate the `trainer:` section, run the recipe; returns the exit status. An output_dir that an
    earlier run used is resumed (a checkpoint of the same config; 0 at once when it is finished) or refused
    (`nemo_gym.train.output_dir`; `+overwrite=true` starts over).

    Raises:
        ConfigError: no or a bad `trainer:` section (each key named, an unknown one with a suggestion), or an
            output_dir that holds another run's outputs.
    """
    cfg = trainer_config(loaded)
    problems, warnings = check_hardware(cfg, cuda_available=torch.cuda.is_available())
    problems = check_algorithm(cfg) + problems
    if problems:
        raise ConfigError(f"{loaded.origin('trainer')}: {'; '.join(problems)}")
    if distributed.is_main():
        for warning in warnings:
            print(f"ng_train: WARNING {warning}", file=sys.stderr, flush=True)
    # an output_dir an earlier run used: resume it (same config, a checkpoint), or stop (nemo_gym.train.output_dir)
    cfg, state = prepare_output_dir(
        cfg, overwrite=loaded.values.get(OVERWRITE_KEY) is True, is_main=distributed.is_main()
    )
    if state == "finished":
        return 0
    if distributed.is_main():
        write_run_config(cfg)
    if distributed.needs_relaunch(cfg.num_ranks):  # the same command, as num_ranks ranks under torch's launcher
        decided = [arg for arg in argv if arg.lstrip("+").partition("=")[0] != OVERWRITE_KEY] + (
            ["++trainer.resume=true"] if state == "resume" else []
        )
        return distributed.relaunch(cfg.num_ranks, decided)
    status = run_stoppable(make_trainer(cfg, argv))  # setup, train, cleanup; a stop signal ends it cleanly
    distributed.shutdown()  # every rank gets here (a failing rank raises instead, and the launcher stops the others)
    return status


def make_recipe(cfg: TrainerConfig, argv: list[str]) -> Recipe:
    """The recipe of `trainer.algorithm`: GRPO (nemo_gym.train.grpo), sft / pretrain (nemo_gym.train.supervised) or
    on_distill (nemo_gym.train.distill).

    Raises:
        ConfigError: a supervised mode's config it cannot run (`check_supervised`).
    """
    if cfg.algorithm in ("sft", "pretrain"):
        check_supervised(cfg)
        return SupervisedRecipe(cfg, argv)
    if cfg.algorithm == "on_distill":
        return OnPolicyDistillRecipe(cfg, argv)
    return GRPORecipe(cfg, argv)


def make_trainer(cfg: TrainerConfig, argv: list[str]) -> TrainingLoop:
    """The training loop running the recipe of `trainer.algorithm` (`make_recipe`)."""
    return TrainingLoop(make_recipe(cfg, argv))
