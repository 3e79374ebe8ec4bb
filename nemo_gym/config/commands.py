"""The `ng_*` commands, each declared once: its name, summary, options model and main.

Options and main are `"module:attribute"` strings, imported only when the command runs, so this module sits at the
bottom of the import graph (it imports the config and the errors, nothing else of nemo_gym): `ng`, the console
scripts (`nemo_gym.cli`), background runs (`nemo_gym.runs.background`), team jobs (`nemo_gym.team.job`) and the ranks
of a distributed `ng_train` (`nemo_gym.train.distributed`) all run a command by name through `main`. A command
main takes its validated options, or its raw arguments when it reads them itself (`takes_argv`: the commands with
a free-form config and those that first take flags off, such as `+remote=true`).

`+help=true`, `+h=true`, `--help` and `-h` print every parameter with its type, default and meaning. Unknown
parameters of the commands with a fixed parameter set get a "did you mean" suggestion.
"""

from __future__ import annotations

import importlib
import os
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import NoneType
from typing import Any, get_args

from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_gym.common.errors import NemoGymError
from nemo_gym.config import closest_parameter, did_you_mean, parse_overrides, validation_problems

__all__ = ["COMMANDS", "Command", "dispatch", "format_help", "main", "parse_options", "unknown_command"]

HELP_FLAGS = {"--help", "-h", "+help=true", "+h=true", "++help=true", "++h=true", "help=true"}


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _load(reference: str) -> Any:
    """The object a `"module:attribute"` reference names (the module is imported now)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Command:
    """One `ng_<name>` command. `options_ref` and `main_ref` are `"module:attribute"`, loaded when used."""

    name: str
    summary: str
    options_ref: str  # its pydantic options model (its parameters, for +help=true and validation)
    main_ref: str  # its main: main(options) -> exit status, or main(argv) when `takes_argv`
    strict: bool = True  # parameters are exactly the options' fields (else: a free-form config)
    takes_argv: bool = False  # main reads the raw arguments itself
    positional: tuple[
        str, ...
    ] = ()  # fields that may also be given as bare arguments, in this order (`ng_runs stop <id>`)

    def options(self) -> type[BaseModel]:
        """The options model (imports its module)."""
        return _load(self.options_ref)

    def main(self) -> Callable[[Any], int]:
        """The main function (imports its module)."""
        return _load(self.main_ref)


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in [
        Command(
            "run",
            "start the servers of a config (each in its own process and environment) until Ctrl-C",
            "nemo_gym.orchestration.run:RunOptions",
            "nemo_gym.cli.run:main",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "prefetch",
            "build what ng_run of a config would build (each server's environment, vllm_model's engine and converted"
            " model), starting nothing, so that ng_run then starts without building (0.7.0's gym env prefetch)",
            "nemo_gym.orchestration.run:RunOptions",
            "nemo_gym.cli.run:prefetch",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "collect_rollouts",
            "send dataset rows through an agent concurrently and write rollouts as JSONL (resumable)",
            "nemo_gym.collect.command:CollectConfig",
            "nemo_gym.cli.collect:main",
            takes_argv=True,
        ),
        Command(
            "profile",
            "per-task reward statistics (mean, std, min, max, pass rate) from rollouts",
            "nemo_gym.collect.profile:ProfileConfig",
            "nemo_gym.collect.profile:profile_main",
        ),
        Command(
            "reward_profile",
            "NeMo Gym 0.4.0's reward profile: per-task and per-agent mean/max/min/median/std of every numeric field,"
            " from materialized inputs and rollouts",
            "nemo_gym.upstream.reward_profile:RewardProfileConfig",
            "nemo_gym.upstream.reward_profile:reward_profile_main",
        ),
        Command(
            "group_verify",
            "score collected rollouts again, one group per task, with a resources server's /verify_group (e.g."
            " llm_judge)",
            "nemo_gym.collect.group_verify:GroupVerifyOptions",
            "nemo_gym.collect.group_verify:group_verify_main",
        ),
        Command(
            "train",
            "train the policy (DeepSpeed): GRPO on rollouts from the config's environments with weight sync to"
            " vllm_model, or trainer.algorithm=sft | pretrain | on_distill; `@config.toml` reads a Prime-style TOML,"
            " +init=true prints one",
            "nemo_gym.train.config:TrainOptions",
            "nemo_gym.cli.train:main",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "status",
            "list running servers with ports, PIDs, uptime and health",
            "nemo_gym.orchestration.status:StatusOptions",
            "nemo_gym.cli.status:main",
        ),
        Command(
            "dump_config",
            "print the resolved config with secrets masked",
            "nemo_gym.cli.about:DumpConfigOptions",
            "nemo_gym.cli.about:dump_config_main",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "init_resources_server",
            "scaffold a working resources server folder (app, config, data, tests, README)",
            "nemo_gym.scaffold.resources_server:InitOptions",
            "nemo_gym.scaffold.resources_server:init_main",
        ),
        Command(
            "init_environment",
            "scaffold a manifest-backed environment: environments/<name>/ (manifest, config, data) and its resources"
            " server (NeMo Gym 0.7.0's gym env init --environment)",
            "nemo_gym.scaffold.environment:InitEnvironmentOptions",
            "nemo_gym.scaffold.environment:init_environment_main",
        ),
        Command(
            "init_benchmark",
            "scaffold a manifest-backed benchmark: benchmarks/<name>/ (manifest, config, prompt, prepare.py, data) and"
            " its exact-answer resources server (NeMo Gym 0.7.0's gym env init --benchmark)",
            "nemo_gym.scaffold.environment:InitBenchmarkOptions",
            "nemo_gym.scaffold.environment:init_benchmark_main",
        ),
        Command(
            "init",
            "create a runnable project from a template: ng_init +template=<name> +name=<project> (+template=list shows"
            " them)",
            "nemo_gym.scaffold.projects:ProjectInitOptions",
            "nemo_gym.scaffold.projects:init_main",
        ),
        Command(
            "test",
            "run a server's tests (and verifier cases, conformance checks, data checks) in its own environment",
            "nemo_gym.orchestration.folder_tests:TestOptions",
            "nemo_gym.orchestration.folder_tests:test_main",
        ),
        Command(
            "test_all",
            "ng_test every server folder, a few at a time, with a summary table",
            "nemo_gym.orchestration.folder_tests:TestAllOptions",
            "nemo_gym.orchestration.folder_tests:test_all_main",
        ),
        Command(
            "dev_test",
            "run the core tests with coverage and print the coverage figure",
            "nemo_gym.orchestration.folder_tests:DevTestOptions",
            "nemo_gym.orchestration.folder_tests:dev_test_main",
        ),
        Command(
            "pip_list",
            "list the packages of a server's environment (uv pip list)",
            "nemo_gym.orchestration.folder_tests:PipListOptions",
            "nemo_gym.orchestration.folder_tests:pip_list_main",
        ),
        Command(
            "reverify",
            "score collected rollouts again with the running resources servers (each in a seeded session, its tool"
            " calls replayed), the old reward kept (NeMo Gym 0.7.0's gym eval reverify)",
            "nemo_gym.eval.reverify:ReverifyOptions",
            "nemo_gym.eval.reverify:reverify_main",
        ),
        Command(
            "row_schema",
            "the JSON Schema of a resources server's dataset rows (the task fields its verify and seed requests take),"
            " read in its own environment (NeMo Gym 0.7.0's gym env schema)",
            "nemo_gym.orchestration.folder_tests:RowSchemaOptions",
            "nemo_gym.orchestration.folder_tests:row_schema_main",
        ),
        Command(
            "prepare_data",
            "validate the datasets a config declares and write them with metrics (train or example)",
            "nemo_gym.datasets.prepare:PrepareDataOptions",
            "nemo_gym.datasets.prepare:prepare_command",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "viewer",
            "browse a rollouts JSONL in the browser (Gradio; table, filters, trajectories, reward statistics)",
            "nemo_gym.viewer.options:ViewerOptions",
            "nemo_gym.viewer.app:viewer_main",
        ),
        Command("help", "list the ng_* commands", "nemo_gym.config.commands:NoOptions", "nemo_gym.cli.about:help_main"),
        Command(
            "version",
            "print the nemo_gym version (+json=true for JSON)",
            "nemo_gym.cli.about:VersionOptions",
            "nemo_gym.cli.about:version_main",
        ),
        Command(
            "upload_dataset_to_hf",
            "upload a JSONL dataset to a private Hugging Face dataset repo (and its collection)",
            "nemo_gym.datasets.hf:UploadToHfOptions",
            "nemo_gym.datasets.hf:upload_main",
        ),
        Command(
            "download_dataset_from_hf",
            "download a file of a Hugging Face dataset repo (checksum verified)",
            "nemo_gym.datasets.hf:DownloadFromHfOptions",
            "nemo_gym.datasets.hf:download_main",
        ),
        Command(
            "upload_dataset_to_gitlab",
            "upload a JSONL dataset version to the GitLab generic package registry",
            "nemo_gym.datasets.gitlab:UploadToGitlabOptions",
            "nemo_gym.datasets.gitlab:upload_main",
        ),
        Command(
            "download_dataset_from_gitlab",
            "download a dataset version from the GitLab generic package registry (checksum verified)",
            "nemo_gym.datasets.gitlab:DownloadFromGitlabOptions",
            "nemo_gym.datasets.gitlab:download_main",
        ),
        Command(
            "delete_dataset_from_gitlab",
            "delete a dataset (all versions) from GitLab, after a confirmation (+yes=true skips it)",
            "nemo_gym.datasets.gitlab:DeleteFromGitlabOptions",
            "nemo_gym.datasets.gitlab:delete_main",
        ),
        Command(
            "gitlab_to_hf_dataset",
            "move a dataset from GitLab to the Hugging Face Hub (upload, then delete from GitLab)",
            "nemo_gym.datasets.hf:GitlabToHfOptions",
            "nemo_gym.datasets.hf:gitlab_to_hf_main",
        ),
        Command(
            "login",
            "save a token for hf, gitlab or wandb (+service=) or a run server (+server=URL) in"
            " $NEMO_GYM_HOME/credentials.json (mode 0600)",
            "nemo_gym.cli.login:LoginOptions",
            "nemo_gym.cli.login:login_main",
        ),
        Command(
            "logout",
            "forget saved tokens (+service=hf|gitlab|wandb, +server=URL; default all)",
            "nemo_gym.cli.login:LogoutOptions",
            "nemo_gym.cli.login:logout_main",
        ),
        Command(
            "runs",
            "background runs (the run server's when logged in): list, logs <id> [+follow=true], stop <id>"
            " [+save_model=true], delete <id>, download <id> +output=DIR",
            "nemo_gym.runs.command:RunsOptions",
            "nemo_gym.cli.runs:main",
            positional=("verb", "id"),
        ),
        Command(
            "serve",
            "the team run server: an authenticated API in front of Ray Jobs (+admin=... manages organizations, users,"
            " tokens)",
            "nemo_gym.team.command:ServeOptions",
            "nemo_gym.team.command:serve_main",
            positional=("admin",),
        ),
        Command(
            "orgs",
            "list your organizations on the run server, or switch the active one: ng_orgs <ORG>",
            "nemo_gym.team.client:OrgsOptions",
            "nemo_gym.team.client:orgs_main",
            positional=("org",),
        ),
        Command(
            "export",
            "write a merged HF model folder (LoRA merged, lm_head explicit) from a run, output_dir or checkpoint:"
            " ng_export <source> +output=DIR",
            "nemo_gym.model_files.export:ExportOptions",
            "nemo_gym.model_files.export:export_main",
            positional=("source",),
        ),
        Command(
            "try",
            "smoke-test rollouts: N rollouts of chosen entries of an rnow project or task JSONL with any model, printed"
            " and saved as JSON",
            "nemo_gym.tryout.options:TryOptions",
            "nemo_gym.tryout.rollouts:try_main",
            strict=False,
            takes_argv=True,
        ),
        Command(
            "environments",
            "list the environments (resources servers) under the search roots and this repository: name, domain,"
            " description; +name=<name> shows one (NeMo Gym 0.7.0's gym list resources-servers)",
            "nemo_gym.datasets.environments:EnvironmentsOptions",
            "nemo_gym.datasets.environments:environments_main",
        ),
        Command(
            "export_atif",
            "rollouts as ATIF trajectories (Harbor's Agent Trajectory Interchange Format), a JSON file per rollout and"
            " a manifest in a new folder (NeMo Gym 0.7.0's gym eval export --format atif)",
            "nemo_gym.eval.atif_export:ExportAtifOptions",
            "nemo_gym.eval.atif_export:export_atif_main",
        ),
        Command(
            "health_check",
            "the rollout health checks of a collection, from its ng_trajectory capture records: a verdict per rollout"
            " (healthy, unhealthy, unobserved), quality_summary.json and rollout_verdicts.jsonl (NeMo Gym 0.7.0's gym"
            " eval health-check)",
            "nemo_gym.collect.health:HealthCheckOptions",
            "nemo_gym.collect.health:health_check_main",
        ),
        Command(
            "models",
            "list the models to train or serve: embedded, Hugging Face cache, trained checkpoints and exports, the run"
            " server's (+json=true)",
            "nemo_gym.model_files.listing:ModelsOptions",
            "nemo_gym.model_files.listing:models_main",
        ),
        Command(
            "eval",
            "pass@k (unbiased), pass^k and mean reward per environment, from n samples per task or existing rollouts",
            "nemo_gym.eval.command:EvalConfig",
            "nemo_gym.eval.command:eval_main",
        ),
    ]
}


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = str(annotation).replace("typing.", "")
    return text.replace("NoneType", "None")


def format_help(command: Command) -> str:
    """Every parameter of a command: `+name: type = default  meaning`."""
    options = command.options()
    lines = [f"ng_{command.name}: {command.summary}", "", "Parameters (pass as +name=value):"]
    if command.positional:
        lines[-1] = (
            f"Parameters (pass as +name=value; {', '.join(command.positional)} also as bare arguments, in this order):"
        )
    lines += _field_lines(options, "")
    if not command.strict:
        lines += [
            "",
            (
                "Any other key is config: server instances and values used by ${...} interpolation (e.g."
                " +policy_base_url=...)."
            ),
        ]
    lines += ["", "Help: +help=true, +h=true or --help."]
    return "\n".join(lines)


def _field_lines(model: type[BaseModel], prefix: str, optional: bool = False) -> list[str]:
    """The help lines of `model`'s keys, each `+<prefix><key>`; `optional`: the section itself may be left out."""
    lines = []
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        annotation = info.annotation
        # a section (`X`, or `X | None`: optional) lists its own keys, `+<key>.<its key>`
        section = next((a for a in (annotation, *get_args(annotation)) if isinstance(a, type)), None)
        if section is not None and issubclass(section, BaseModel) and set(get_args(annotation)) <= {section, NoneType}:
            lines += _field_lines(section, key + ".", optional=section is not annotation)
            continue
        required = f"required with +{prefix[:-1]}" if optional else "required"
        default = required if info.is_required() else repr(info.get_default(call_default_factory=True))
        lines.append(f"  +{key}: {_type_name(annotation)} = {default}\n      {info.description or ''}")
    return lines


def _positional_values(command: Command, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split off the bare arguments (no `=`, no leading `+`/`-`) of a command that declares positional fields."""
    if not command.positional:
        return argv, {}
    bare = [arg for arg in argv if "=" not in arg and not arg.startswith(("+", "-"))]
    if len(bare) > len(command.positional):
        raise NemoGymError(
            f"ng_{command.name}: too many arguments {bare[len(command.positional) :]}; it takes"
            f" {' '.join(f'<{p}>' for p in command.positional)} (see +help=true)"
        )
    return [arg for arg in argv if arg not in bare], dict(zip(command.positional, bare))


def parse_options(command: Command, argv: list[str]) -> BaseModel:
    """The validated options of a strict command from its arguments.

    Raises:
        NemoGymError: an unknown parameter (with a suggestion), a value given twice, or an invalid value.
    """
    options = command.options()
    argv, positional = _positional_values(command, argv)
    cli = OmegaConf.create({})
    for key, value in parse_overrides(argv):
        OmegaConf.update(cli, key, value, force_add=True, merge=False)
    values = OmegaConf.to_container(cli, resolve=True)
    for key, value in positional.items():
        if key in values:
            raise NemoGymError(f"ng_{command.name}: <{key}> given twice (as an argument and as +{key}=...)")
        values[key] = value
    known = {info.alias or name for name, info in options.model_fields.items()}
    unsupported = getattr(options, "nemo_gym_unsupported", {})
    for key in values:
        if key in unsupported:  # a NeMo Gym parameter this command does not take: say why, not "unknown"
            raise NemoGymError(
                f"ng_{command.name}: +{key} is a NeMo Gym parameter that ng_{command.name} does not take:"
                f" {unsupported[key]}"
            )
        if key not in known:
            raise NemoGymError(
                f"ng_{command.name}: unknown parameter +{key}{closest_parameter(key, known)}. Parameters:"
                f" {', '.join(sorted(known))} (see +help=true)"
            )
    try:
        return options.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(options, exc, "+{key}"))
        raise NemoGymError(f"ng_{command.name}: {problems} (see +help=true)") from exc


def main(name: str, argv: list[str] | None = None, commands: Mapping[str, Command] | None = None) -> int:
    """Run command `name` of `commands` (default COMMANDS; `nemo_gym.cli.legacy` passes NeMo Gym 0.7.0's others)
    with `argv` (default: sys.argv[1:]). Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = (COMMANDS if commands is None else commands)[name]
    try:
        if any(arg.lower() in HELP_FLAGS for arg in argv):
            print(format_help(command))
            return 0
        return command.main()(argv if command.takes_argv else parse_options(command, argv))
    except NemoGymError as exc:
        message = str(exc)
        print(message if message.startswith("ng_") else f"ng_{name}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early: not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 0


def dispatch(argv: list[str]) -> int:
    """Run `argv[0]` (`test`, `ng_test` or `nemo_gym_test`) with the remaining arguments. Returns the exit status."""
    if not argv or argv[0].lower() in HELP_FLAGS:
        return main("help", [])
    name = argv[0].removeprefix("nemo_gym_").removeprefix("ng_")
    if name not in COMMANDS:
        print(f"ng: {unknown_command(name)}", file=sys.stderr)
        return 2
    return main(name, argv[1:])


def unknown_command(name: str) -> str:
    """Message for an unknown command name, with a suggestion."""
    return f"unknown command ng_{name}{did_you_mean(name, COMMANDS)}; run ng_help for the list"
