"""The `ng_*` commands (also installed as `nemo_gym_*`). Each takes Hydra overrides `+key=value`.

`+help=true`, `+h=true`, `--help` and `-h` print every parameter with its type, default and meaning.
Unknown parameters of the commands with a fixed parameter set get a "did you mean" suggestion.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import signal
import sys

import typing
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable

import yaml
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_gym.config import did_you_mean, load_config, mask_secrets, parse_overrides
from nemo_gym.errors import NemoGymError

__all__ = ["COMMANDS", "main", "dispatch"]

HELP_FLAGS = {"--help", "-h", "+help=true", "+h=true", "++help=true", "++h=true", "help=true"}


class StatusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    json_output: bool = Field(False, alias="json", description="print JSON instead of a table")
    head_server_url: str | None = Field(None, description="head server of the run to show (default: every live run)")


class VersionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    json_output: bool = Field(False, alias="json", description="print JSON instead of text")


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DumpConfigOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    config_paths: list[str] = Field(default_factory=list, description="YAML files merged in order (then env.yaml, then overrides)")


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    options: Callable[[], type[BaseModel]]
    strict: bool  # parameters are exactly the options' fields (else: a free-form config)
    positional: tuple[str, ...] = ()  # fields that may also be given as bare arguments, in this order (`ng_runs stop <id>`)


def _options(module: str, name: str) -> Callable[[], type[BaseModel]]:
    return lambda: getattr(importlib.import_module(module), name)


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in [
        Command("run", "start the servers of a config (each in its own process and environment) until Ctrl-C", _options("nemo_gym.run", "RunOptions"), False),
        Command("collect_rollouts", "send dataset rows through an agent concurrently and write rollouts as JSONL (resumable)", _options("nemo_gym.collect", "CollectConfig"), True),
        Command("profile", "per-task reward statistics (mean, std, min, max, pass rate) from rollouts", _options("nemo_gym.profile", "ProfileConfig"), True),
        Command("reward_profile", "NeMo Gym 0.4.0's reward profile: per-task and per-agent mean/max/min/median/std of every numeric field, from materialized inputs and rollouts", _options("nemo_gym.reward_profile", "RewardProfileConfig"), True),
        Command("group_verify", "score collected rollouts again, one group per task, with a resources server's /verify_group (e.g. llm_judge)", _options("nemo_gym.group_verify", "GroupVerifyOptions"), True),
        Command("train", "train the policy (DeepSpeed): GRPO on rollouts from the config's environments with weight sync to vllm_model, or trainer.algorithm=sft | pretrain | on_distill; `@config.toml` reads a Prime-style TOML, +init=true prints one", _options("nemo_gym.train.config", "TrainOptions"), False),
        Command("status", "list running servers with ports, PIDs, uptime and health", lambda: StatusOptions, True),
        Command("dump_config", "print the resolved config with secrets masked", lambda: DumpConfigOptions, False),
        Command("init_resources_server", "scaffold a working resources server folder (app, config, data, tests, README)", _options("nemo_gym.authoring", "InitOptions"), True),
        Command("init", "create a runnable project from a template: ng_init +template=<name> +name=<project> (+template=list shows them)", _options("nemo_gym.project_templates", "ProjectInitOptions"), True),
        Command("test", "run a server's tests (and verifier cases, data checks) in its own environment", _options("nemo_gym.testing", "TestOptions"), True),
        Command("test_all", "ng_test every server folder, a few at a time, with a summary table", _options("nemo_gym.testing", "TestAllOptions"), True),
        Command("dev_test", "run the core tests with coverage and print the coverage figure", _options("nemo_gym.testing", "DevTestOptions"), True),
        Command("pip_list", "list the packages of a server's environment (uv pip list)", _options("nemo_gym.testing", "PipListOptions"), True),
        Command("prepare_data", "validate the datasets a config declares and write them with metrics (train or example)", _options("nemo_gym.prepare_data", "PrepareDataOptions"), False),
        Command("viewer", "browse a rollouts JSONL in the browser (Gradio; table, filters, trajectories, reward statistics)", _options("nemo_gym.viewer.options", "ViewerOptions"), True),
        Command("help", "list the ng_* commands", lambda: NoOptions, True),
        Command("version", "print the nemo_gym version (+json=true for JSON)", lambda: VersionOptions, True),
        Command("upload_dataset_to_hf", "upload a JSONL dataset to a private Hugging Face dataset repo (and its collection)", _options("nemo_gym.datasets.hf", "UploadToHfOptions"), True),
        Command("download_dataset_from_hf", "download a file of a Hugging Face dataset repo (checksum verified)", _options("nemo_gym.datasets.hf", "DownloadFromHfOptions"), True),
        Command("upload_dataset_to_gitlab", "upload a JSONL dataset version to the GitLab generic package registry", _options("nemo_gym.datasets.gitlab", "UploadToGitlabOptions"), True),
        Command("download_dataset_from_gitlab", "download a dataset version from the GitLab generic package registry (checksum verified)", _options("nemo_gym.datasets.gitlab", "DownloadFromGitlabOptions"), True),
        Command("delete_dataset_from_gitlab", "delete a dataset (all versions) from GitLab, after a confirmation (+yes=true skips it)", _options("nemo_gym.datasets.gitlab", "DeleteFromGitlabOptions"), True),
        Command("gitlab_to_hf_dataset", "move a dataset from GitLab to the Hugging Face Hub (upload, then delete from GitLab)", _options("nemo_gym.datasets.hf", "GitlabToHfOptions"), True),
        Command("login", "save a token for hf, gitlab or wandb (+service=) or a run server (+server=URL) in $NEMO_GYM_HOME/credentials.json (mode 0600)", _options("nemo_gym.datasets.login", "LoginOptions"), True),
        Command("logout", "forget saved tokens (+service=hf|gitlab|wandb, +server=URL; default all)", _options("nemo_gym.datasets.login", "LogoutOptions"), True),
        Command("runs", "background runs (the run server's when logged in): list, logs <id> [+follow=true], stop <id> [+save_model=true], delete <id>, download <id> +output=DIR", _options("nemo_gym.runs", "RunsOptions"), True, ("verb", "id")),
        Command("serve", "the team run server: an authenticated API in front of Ray Jobs (+admin=... manages organizations, users, tokens)", _options("nemo_gym.team.server", "ServeOptions"), True, ("admin",)),
        Command("orgs", "list your organizations on the run server, or switch the active one: ng_orgs <ORG>", _options("nemo_gym.team.client", "OrgsOptions"), True, ("org",)),
        Command("export", "write a merged HF model folder (LoRA merged, lm_head explicit) from a run, output_dir or checkpoint: ng_export <source> +output=DIR", _options("nemo_gym.export", "ExportOptions"), True, ("source",)),
        Command("try", "smoke-test rollouts: N rollouts of chosen entries of an rnow project or task JSONL with any model, printed and saved as JSON", _options("nemo_gym.try_rollouts", "TryOptions"), False),
        Command("models", "list the models to train or serve: embedded, Hugging Face cache, trained checkpoints and exports, the run server's (+json=true)", _options("nemo_gym.model_list", "ModelsOptions"), True),
        Command("eval", "pass@k (unbiased), pass^k and mean reward per environment, from n samples per task or existing rollouts", _options("nemo_gym.evaluation", "EvalConfig"), True),
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
        lines[-1] = f"Parameters (pass as +name=value; {', '.join(command.positional)} also as bare arguments, in this order):"
    lines += _field_lines(options, "")
    if not command.strict:
        lines += ["", "Any other key is config: server instances and values used by ${...} interpolation (e.g. +policy_base_url=...)."]
    lines += ["", "Help: +help=true, +h=true or --help."]
    return "\n".join(lines)


def _field_lines(model: type[BaseModel], prefix: str) -> list[str]:
    lines = []
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines += _field_lines(annotation, key + ".")
            continue
        default = "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
        lines.append(f"  +{key}: {_type_name(annotation)} = {default}\n      {info.description or ''}")
    return lines


def _positional_values(command: Command, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split off the bare arguments (no `=`, no leading `+`/`-`) of a command that declares positional fields."""
    if not command.positional:
        return argv, {}
    bare = [arg for arg in argv if "=" not in arg and not arg.startswith(("+", "-"))]
    if len(bare) > len(command.positional):
        raise NemoGymError(f"ng_{command.name}: too many arguments {bare[len(command.positional):]}; it takes {' '.join(f'<{p}>' for p in command.positional)} (see +help=true)")
    return [arg for arg in argv if arg not in bare], dict(zip(command.positional, bare))


def _strict_options(command: Command, argv: list[str]) -> BaseModel:
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
    for key in values:
        if key not in known:
            raise NemoGymError(f"ng_{command.name}: unknown parameter +{key}{did_you_mean(key, known)}. Parameters: {', '.join(sorted(known))} (see +help=true)")
    try:
        return options.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"+{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise NemoGymError(f"ng_{command.name}: {problems} (see +help=true)") from exc


def _run(command: Command, argv: list[str]) -> int:
    if command.name == "run":
        from nemo_gym.rnow.project import expand_rnow_args
        from nemo_gym.run import run_main

        [argv] = expand_rnow_args(argv, mode="run")  # +rnow_project=DIR (a ReinforceNow project) → its translated config
        return run_main(load_config(argv))
    if command.name == "train":
        from nemo_gym.train import prime_toml

        if prime_toml.init_requested(argv):
            print(prime_toml.TEMPLATE, end="")
            return 0
        argv = prime_toml.expand_toml_args(argv)  # `@config.toml` (Prime-style TOML) → +config_paths=[translated config]
        from nemo_gym.rnow.project import expand_rnow_args
        from nemo_gym.runs import BACKGROUND_FLAG, pop_flag, train_in_background

        argv, remote = pop_flag(argv, "remote")
        if remote:  # ng_train +remote=true: submit this folder as a run of the logged-in run server
            from nemo_gym.team.client import submit_remote

            return submit_remote("train", argv)
        status = 0
        for argv in expand_rnow_args(argv, mode="train"):  # +rnow_project=DIR: one run per model.path (else argv as is)
            argv, background = pop_flag(argv, BACKGROUND_FLAG)
            if background:
                status = status or train_in_background(argv)
                continue
            from nemo_gym.train.loop import train_main

            status = status or train_main(load_config(argv), argv)
        return status
    if command.name == "dump_config":
        loaded = load_config(argv)
        print(yaml.safe_dump(mask_secrets(loaded.values), sort_keys=False), end="")
        return 0
    if command.name == "prepare_data":
        from nemo_gym.prepare_data import prepare_main

        return prepare_main(load_config(argv, resolve=False))  # datasets need no secrets or ${...} values
    if command.name == "collect_rollouts":
        from nemo_gym.runs import pop_flag

        argv, remote = pop_flag(argv, "remote")
        if remote:  # ng_collect_rollouts +remote=true: a collection run on the run server
            from nemo_gym.team.client import submit_remote

            _strict_options(command, argv)
            return submit_remote("collect", argv)
    if command.name == "try":
        from nemo_gym.try_rollouts import try_main

        return try_main(argv)
    options = _strict_options(command, argv)
    if command.name == "models":
        from nemo_gym.model_list import models_main

        return models_main(options)
    if command.name == "collect_rollouts":
        from nemo_gym.collect import collect_main

        return collect_main(options)
    if command.name == "profile":
        from nemo_gym.profile import profile_main

        return profile_main(options)
    if command.name == "reward_profile":
        from nemo_gym.reward_profile import reward_profile_main

        return reward_profile_main(options)
    if command.name == "eval":
        from nemo_gym.evaluation import eval_main

        return eval_main(options)
    if command.name == "group_verify":
        from nemo_gym.group_verify import group_verify_main

        return group_verify_main(options)
    if command.name == "status":
        from nemo_gym.status import status_main

        return status_main(options.head_server_url, as_json=options.json_output)
    if command.name == "version":
        return _version(options.json_output)
    if command.name == "runs":
        from nemo_gym.runs import runs_main

        return runs_main(options)
    if command.name == "serve":
        from nemo_gym.team.server import serve_main

        return serve_main(options)
    if command.name == "orgs":
        from nemo_gym.team.client import orgs_main

        return orgs_main(options)
    if command.name == "export":
        from nemo_gym.export import export_main

        return export_main(options)
    if command.name == "init_resources_server":
        from nemo_gym.authoring import init_main

        return init_main(options)
    if command.name == "init":
        from nemo_gym.project_templates import init_main as init_project_main

        return init_project_main(options)
    if command.name == "viewer":
        from nemo_gym.viewer.app import viewer_main

        return viewer_main(options)
    if command.name in _TESTING_MAINS:
        import nemo_gym.testing

        return getattr(nemo_gym.testing, _TESTING_MAINS[command.name])(options)
    if command.name in _DATASET_MAINS:
        module, function = _DATASET_MAINS[command.name]
        return getattr(importlib.import_module(module), function)(options)
    print("nemo_gym commands (each also as nemo_gym_<name>; +help=true for parameters):")
    width = max(len(name) for name in COMMANDS) + 1
    for c in COMMANDS.values():
        print(f"  ng_{c.name:<{width}} {c.summary}")
    return 0


_DATASET_MAINS = {
    "upload_dataset_to_hf": ("nemo_gym.datasets.hf", "upload_main"),
    "download_dataset_from_hf": ("nemo_gym.datasets.hf", "download_main"),
    "gitlab_to_hf_dataset": ("nemo_gym.datasets.hf", "gitlab_to_hf_main"),
    "upload_dataset_to_gitlab": ("nemo_gym.datasets.gitlab", "upload_main"),
    "download_dataset_from_gitlab": ("nemo_gym.datasets.gitlab", "download_main"),
    "delete_dataset_from_gitlab": ("nemo_gym.datasets.gitlab", "delete_main"),
    "login": ("nemo_gym.datasets.login", "login_main"),
    "logout": ("nemo_gym.datasets.login", "logout_main"),
}
_TESTING_MAINS = {"test": "test_main", "test_all": "test_all_main", "dev_test": "dev_test_main", "pip_list": "pip_list_main"}


def _version(as_json: bool) -> int:
    packages = {name: _installed(name) for name in ("fastapi", "uvicorn", "httpx", "pydantic", "openai", "hydra-core", "omegaconf")}
    info = {"nemo_gym": _installed("nemo-gym"), "python": platform.python_version(), "platform": platform.platform(), "dependencies": packages}
    print(json.dumps(info, indent=2) if as_json else f"nemo_gym {info['nemo_gym']} (Python {info['python']})")
    return 0


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(name: str, argv: list[str] | None = None) -> int:
    """Run command `name` with `argv` (default: sys.argv[1:]). Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = COMMANDS[name]
    try:
        if any(arg.lower() in HELP_FLAGS for arg in argv):
            print(format_help(command))
            return 0
        return _run(command, argv)
    except NemoGymError as exc:
        message = str(exc)
        print(message if message.startswith("ng_") else f"ng_{name}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early: not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 0


def _entry(name: str) -> Callable[[], None]:
    def entry() -> None:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # Started as a background job of a non-interactive shell (`ng_... &` in a script, a CI harness), which
            # ignores SIGINT: every ng_ command documents Ctrl-C / SIGINT as its stop, so it gets KeyboardInterrupt back.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.exit(main(name))

    entry.__name__ = f"ng_{name}"
    return entry


ng_run = _entry("run")
ng_collect_rollouts = _entry("collect_rollouts")
ng_profile = _entry("profile")
ng_reward_profile = _entry("reward_profile")
ng_status = _entry("status")
ng_train = _entry("train")
ng_group_verify = _entry("group_verify")
ng_dump_config = _entry("dump_config")
ng_help = _entry("help")
ng_version = _entry("version")
ng_init_resources_server = _entry("init_resources_server")
ng_init = _entry("init")
ng_test = _entry("test")
ng_test_all = _entry("test_all")
ng_dev_test = _entry("dev_test")
ng_pip_list = _entry("pip_list")
ng_prepare_data = _entry("prepare_data")
ng_upload_dataset_to_hf = _entry("upload_dataset_to_hf")
ng_download_dataset_from_hf = _entry("download_dataset_from_hf")
ng_upload_dataset_to_gitlab = _entry("upload_dataset_to_gitlab")
ng_download_dataset_from_gitlab = _entry("download_dataset_from_gitlab")
ng_delete_dataset_from_gitlab = _entry("delete_dataset_from_gitlab")
ng_gitlab_to_hf_dataset = _entry("gitlab_to_hf_dataset")
ng_login = _entry("login")
ng_logout = _entry("logout")
ng_viewer = _entry("viewer")
ng_eval = _entry("eval")
ng_runs = _entry("runs")
ng_serve = _entry("serve")
ng_orgs = _entry("orgs")
ng_export = _entry("export")
ng_try = _entry("try")
ng_models = _entry("models")


def ng() -> None:
    """`ng <command> +key=value ...`: any ng_* command by name, with a suggestion for an unknown one."""
    sys.exit(dispatch(sys.argv[1:]))


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


