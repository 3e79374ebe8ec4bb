"""The classic `verifiers` environment API, seen from nemo_gym: load an environment, read its dataset as task
rows, score a trajectory with its rubric.

An environment package (verifiers' layout: `environments/<name>/<name>.py` or a package `<name>/`) exports
`load_environment(**args) -> vf.Environment`. What this module relies on is that classic contract, not the
`verifiers` package itself (no import of it here), so the adapter serves any package written against it:

- `env.get_dataset()` / `env.get_eval_dataset()` (the eval split falls back to the train split), else the
  attributes `env.dataset` / `env.eval_dataset`: an iterable of rows (a `datasets.Dataset` or a list of
  dicts) with `prompt` (chat messages, or a string for `message_type="completion"`) or `question`, and
  optional `answer`, `task`, `info` (a dict or a JSON string), `id` / `example_id`;
- `env.rubric.score_rollout(prompt, completion, answer, state, task, info)` (async or not), answering a
  `RolloutScore`-like object (or dict) with `reward: float` and `metrics: dict[str, float]`;
- `env.message_type` (`chat` default, or `completion`), `env.system_prompt`, `env.few_shot`.

Only single-turn environments (`SingleTurnEnv`: one model answer, then the rubric) run through the adapter;
an environment with tools (`oai_tools`) or more than one turn (`max_turns` > 1) is refused when loaded.
The `verifiers` generation after 0.1 (`verifiers.v1`, 0.4+) has no `load_environment` API and is not served.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from nemo_gym.common.errors import ConfigError
from nemo_gym.serving.openai_convert import ConversionError, input_items_to_messages

__all__ = [
    "module_for",
    "module_folder",
    "check_args",
    "load_env",
    "task_rows",
    "completion_of",
    "score",
]

Split = Literal["train", "eval"]
ROW_FIELDS = ("answer", "task", "info", "example_id")


def module_for(env_id: str) -> str:
    """The import name of an environment id: `owner/reverse-text` → `reverse_text` (Prime Hub ids name a
    package whose module is the last part with `-` as `_`)."""
    return env_id.strip().split("/")[-1].replace("-", "_")


def _add_python_path(python_path: Iterable[str]) -> None:
    for folder in python_path:
        if folder not in sys.path:
            sys.path.append(folder)  # appended: the server's own packages keep precedence


def module_folder(env_id: str, python_path: Iterable[str] = ()) -> Path | None:
    """The folder to put on `sys.path` to import the environment's module, or None when it is not installed."""
    _add_python_path(python_path)
    try:
        spec = importlib.util.find_spec(module_for(env_id))
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    return origin.parent.parent if origin.name == "__init__.py" else origin.parent


def _load_function(env_id: str, python_path: Iterable[str]) -> Any:
    _add_python_path(python_path)
    name = module_for(env_id)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise ConfigError(
                f"verifiers environment {env_id!r}: importing module {name!r} needs {exc.name!r}, which is not"
                " installed"
            ) from exc
        raise ConfigError(
            f"verifiers environment {env_id!r}: no module {name!r} on the Python path; install the environment package "
            f"(`uv pip install -e environments/{name}` or `prime env install {env_id}`)"
        ) from exc
    function = getattr(module, "load_environment", None)
    if not callable(function):
        raise ConfigError(
            f"verifiers environment {env_id!r}: module {name!r} ({module.__file__}) has no load_environment() function"
        )
    return function


def check_args(env_id: str, args: Mapping[str, Any], python_path: Iterable[str] = (), *, key: str = "args") -> None:
    """Check `args` against the signature of the environment's `load_environment`.

    Raises:
        ConfigError: the module or its `load_environment` is missing, or an argument it does not take
            (named as `<key>.<name>`, with a suggestion and the accepted names).
    """
    parameters = inspect.signature(_load_function(env_id, python_path)).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in args:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"key '{key}.{name}': load_environment() of {env_id!r} takes no argument {name!r}{hint}; it takes:"
                f" {', '.join(accepted) or 'none'}"
            )


def load_env(env_id: str, args: Mapping[str, Any] | None = None, python_path: Iterable[str] = ()) -> Any:
    """`load_environment(**args)` of the environment package, checked to be single-turn.

    Raises:
        ConfigError: see `check_args`; `load_environment` failed; the environment has tools or several turns.
    """
    python_path = list(python_path)
    args = dict(args or {})
    check_args(env_id, args, python_path)
    try:
        env = _load_function(env_id, python_path)(**args)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"verifiers environment {env_id!r}: load_environment(**{args!r}) failed: {type(exc).__name__}: {exc}"
        ) from exc
    if getattr(env, "oai_tools", None):
        raise ConfigError(
            f"verifiers environment {env_id!r} has tools; the adapter serves single-turn environments (SingleTurnEnv)"
            " only"
        )
    max_turns = getattr(env, "max_turns", 1)
    if max_turns not in (None, 1):
        raise ConfigError(
            f"verifiers environment {env_id!r} runs {max_turns} turns; the adapter serves single-turn environments"
            " (SingleTurnEnv) only"
        )
    if not callable(getattr(getattr(env, "rubric", None), "score_rollout", None)):
        raise ConfigError(
            f"verifiers environment {env_id!r}: its rubric has no score_rollout(); only the classic load_environment"
            " API is supported"
        )
    return env


def _dataset(env: Any, split: Split) -> Iterable[Mapping[str, Any]]:
    train = getattr(env, "dataset", None)
    evaluation = getattr(env, "eval_dataset", None)
    if split == "eval" and evaluation is None and train is None:
        raise ConfigError("the environment has neither dataset nor eval_dataset")
    if split == "eval":
        return (
            env.get_eval_dataset()
            if hasattr(env, "get_eval_dataset")
            else (evaluation if evaluation is not None else train)
        )
    if train is None:  # an evaluation-only environment (e.g. a benchmark): train on its eval split
        return _dataset(env, "eval")
    return env.get_dataset() if hasattr(env, "get_dataset") else train


def _prompt(row: Mapping[str, Any], env: Any) -> list[dict[str, Any]] | str:
    if row.get("prompt") is not None:
        prompt = row["prompt"]
        return prompt if isinstance(prompt, str) else [dict(message) for message in prompt]
    if "question" not in row:
        raise ConfigError(f"a dataset row has neither `prompt` nor `question` (keys: {', '.join(row)})")
    messages = [{"role": "system", "content": env.system_prompt}] if getattr(env, "system_prompt", None) else []
    messages += [dict(m) for m in getattr(env, "few_shot", None) or []]
    return messages + [{"role": "user", "content": row["question"]}]


def _info(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return json.loads(value) if value.strip() else {}
    return dict(value or {})


def task_rows(env: Any, split: Split, limit: int | None = None) -> list[dict[str, Any]]:
    """The environment's dataset rows as nemo_gym task rows: `responses_create_params.input` = the prompt,
    plus the task fields the rubric reads (`answer`, `task`, `info`, `example_id`).

    Raises:
        ConfigError: a row without `prompt` or `question`.
    """
    rows = []
    for index, row in enumerate(_dataset(env, split)):
        if limit is not None and index >= limit:
            break
        example_id = row.get("example_id", row.get("id", index))
        rows.append(
            {
                "responses_create_params": {"input": _prompt(row, env)},
                "answer": "" if row.get("answer") is None else str(row["answer"]),
                "task": row.get("task") or "default",
                "info": _info(row.get("info")),
                "example_id": example_id,
            }
        )
    return rows


def completion_of(response: Mapping[str, Any], message_type: str = "chat") -> list[dict[str, Any]] | str:
    """The rollout's completion as verifiers sees it: the chat messages after the prompt (assistant answers,
    tool calls and results), or their text for `message_type="completion"`. Reasoning items are dropped.

    Raises:
        ConversionError: `response.output` is not a list of items of chat shape (model output is untrusted).
    """
    output = response.get("output") or []
    if not isinstance(output, list):
        raise ConversionError(f"response.output must be a list of items, got {type(output).__name__}")
    messages = input_items_to_messages(output)
    if message_type == "completion":
        return "".join(
            m.get("content") or ""
            for m in messages
            if m.get("role") == "assistant" and isinstance(m.get("content"), str)
        )
    for message in messages:
        if message.get("role") == "assistant" and message.get("content") is None:
            message["content"] = ""
    return messages


async def score(env: Any, row: Mapping[str, Any], response: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
    """(reward, metrics per reward function) of one rollout, by the environment's rubric.

    Raises:
        ConversionError: `response.output` is malformed (`completion_of`), before the rubric runs.
        whatever the rubric raises (verifiers' own Rubric turns a failing reward function into 0.0).
    """
    prompt = row["responses_create_params"].get("input", [])
    completion = completion_of(response, getattr(env, "message_type", "chat"))
    answer, task, info = row.get("answer", ""), row.get("task") or "default", _info(row.get("info"))
    state = {
        "prompt": prompt,
        "completion": completion,
        "answer": answer,
        "task": task,
        "info": info,
        "example_id": row.get("example_id"),
        "responses": [response],
        "turn": 1,
        "timing": {"generation_ms": 0.0, "scoring_ms": 0.0, "total_ms": 0.0},
    }
    result = env.rubric.score_rollout(prompt, completion, answer, state, task=task, info=info)
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, Mapping):
        reward, metrics = result["reward"], result.get("metrics") or {}
    else:
        reward, metrics = result.reward, getattr(result, "metrics", None) or {}
    return float(reward), {str(k): float(v) for k, v in metrics.items()}
