"""Every config model says "did you mean" for an unknown key: the options of every command (nested sections
included) and the trainer's sections, through the one formatter `nemo_gym.config.validation_problems`."""

from __future__ import annotations

import types
import typing

import pytest
from pydantic import BaseModel, ValidationError

from nemo_gym.config import validation_problems
from nemo_gym.config.commands import COMMANDS
from nemo_gym.train.config import TrainerConfig


def _sections(
    model: type[BaseModel], path: tuple[str, ...] = ()
) -> typing.Iterator[tuple[tuple[str, ...], type[BaseModel]]]:
    """(key path, model) of `model` and of each section nested in it (a field whose type is a model or an optional
    one)."""
    yield path, model
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if typing.get_origin(annotation) not in (None, typing.Union, types.UnionType):
            continue  # list[Model], dict[str, Model]: entries, not sections
        for candidate in (annotation, *typing.get_args(annotation)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel) and candidate is not model:
                yield from _sections(candidate, (*path, info.alias or name))


def _cases() -> list[tuple[str, type[BaseModel], tuple[str, ...], type[BaseModel]]]:
    roots = {f"ng_{name}": command.options() for name, command in COMMANDS.items()} | {"trainer": TrainerConfig}
    return [
        pytest.param(root, model, path, section, id=".".join((root, *path)))
        for root, model in roots.items()
        for path, section in _sections(model)
        if section.model_config.get("extra") == "forbid" and section.model_fields
    ]


@pytest.mark.parametrize(("root", "model", "path", "section"), _cases())
def test_an_unknown_key_gets_a_suggestion(root, model, path, section):
    key = max((info.alias or name for name, info in section.model_fields.items()), key=len)
    misspelled = key[:-1]  # `num_step` for `num_steps`
    values: dict = {misspelled: 1}
    for part in reversed(path):
        values = {part: values}
    with pytest.raises(ValidationError) as caught:
        model.model_validate(values)
    problems = validation_problems(model, caught.value, "+{key}")
    assert any(
        f"+{'.'.join((*path, misspelled))}: not a key" in p and f"did you mean '{key}'?" in p for p in problems
    ), problems


def test_trainer_unknown_key_message():
    with pytest.raises(ValidationError) as caught:
        TrainerConfig.model_validate({"num_step": 3})
    problems = validation_problems(TrainerConfig, caught.value, "trainer.{key}")
    assert any(
        p.startswith("trainer.num_step: not a key of trainer (did you mean 'num_steps'?); its keys: algorithm,")
        for p in problems
    )


def test_an_unknown_section_key_gets_the_one_key_of_its_role_before_the_closest_spelling():
    class Files(BaseModel, extra="forbid"):
        output_dirpath: str = ""
        rollouts_jsonl_fpath: str = ""

    class Top(BaseModel, extra="forbid"):
        files: Files

    with pytest.raises(ValidationError) as caught:
        Top.model_validate({"files": {"output_jsonl_fpath": "x"}})  # NeMo Gym's name for an output file
    [problem] = validation_problems(Top, caught.value)
    assert problem.startswith("files.output_jsonl_fpath: not a key of files (did you mean 'output_dirpath'?)")
