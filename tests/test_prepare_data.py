"""ng_prepare_data: datasets declared in a config → validated, collated JSONL and NeMo Gym-style metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.cli import main
from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.config import load_config
from nemo_gym.datasets.prepare import PrepareDataOptions, prepare_data
from nemo_gym.env.dataset_metrics import dataset_metrics, summary


def row(text: str, **extra) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}], **extra}, "task_id": text}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [
            row("a", temperature=0.5),
            row("b c", temperature=1.0, tools=[{"type": "function", "name": "t"}]),
            row("d", temperature=1.0),
        ],
    )
    validation = write_jsonl(tmp_path / "validation.jsonl", [row("e")])
    example = write_jsonl(tmp_path / "example.jsonl", [row(str(i)) for i in range(5)])
    path = tmp_path / "agent.yaml"
    path.write_text(f"""# ng_prepare_data "+config_paths=[{path}]" +output_dirpath=out +mode=train_preparation
my_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: env}}
      model_server: {{type: responses_api_models, name: policy_model}}
      datasets:
        - {{name: tr, type: train, jsonl_fpath: {train}, num_repeats: 2, license: Apache 2.0}}
        - {{name: va, type: validation, jsonl_fpath: {validation}}}
        - {{name: ex, type: example, jsonl_fpath: {example}}}
""")
    return path


def run(config: Path, out: Path, mode: str) -> dict[str, Path]:
    argv = [f"+config_paths=[{config}]", f"+output_dirpath={out}", f"+mode={mode}"]
    loaded = load_config(argv, resolve=False)
    return prepare_data(loaded, PrepareDataOptions.model_validate(loaded.values))


def test_summary_worked_example() -> None:
    # temperatures 0.5, 1, 1: mean 2.5/3 = 0.8333; squared deviations 0.1111 + 0.0278 + 0.0278 = 0.1667;
    # sample variance 0.1667 / 2 = 0.0833, standard deviation 0.2887 → 0.289 (3 decimals below 1)
    assert summary([0.5, 1.0, 1.0]) == {
        "Total # non-null values": 3,
        "Average": 0.833,
        "Min": 0.5,
        "Max": 1.0,
        "Standard deviation": 0.289,
    }
    assert summary([10.0, 14.0]) == {
        "Total # non-null values": 2,
        "Average": 12.0,
        "Min": 10.0,
        "Max": 14.0,
        "Standard deviation": 2.83,
    }
    assert summary([])["Total # non-null values"] == 0


def test_train_preparation_writes_repeated_rows_and_metrics(config: Path, tmp_path: Path) -> None:
    written = run(config, tmp_path / "out", "train_preparation")
    assert set(written) == {"train", "validation"}
    train = [json.loads(line) for line in written["train"].read_text().splitlines()]
    assert [r["task_id"] for r in train] == ["a", "a", "b c", "b c", "d", "d"]  # num_repeats: 2
    assert all(r["agent_ref"] == {"name": "my_agent"} for r in train)
    metrics = json.loads((tmp_path / "out" / "train_metrics.json").read_text())
    (tr,) = metrics["datasets"]
    assert tr["name"] == "tr" and tr["license"] == "Apache 2.0" and tr["Number of examples"] == 3
    assert tr["Temperature"] == summary([0.5, 1.0, 1.0])
    assert tr["Number of tools"]["Total # non-null values"] == 1 and tr["Number of turns"]["Average"] == 1.0
    assert tr["task_id"] == {"unique_count": 3, "total_count": 3}
    assert metrics["prepared"]["Number of examples"] == 6
    assert not (tmp_path / "train_metrics.json").exists()  # only example_validation writes next to the data


def test_example_validation_writes_metrics_next_to_the_examples(config: Path, tmp_path: Path) -> None:
    written = run(config, tmp_path / "out", "example_validation")
    assert set(written) == {"example"}
    stored = json.loads((tmp_path / "example_metrics.json").read_text())
    rows = read_jsonl(tmp_path / "example.jsonl")
    assert stored == {
        "name": "ex",
        "type": "example",
        "jsonl_fpath": str(tmp_path / "example.jsonl"),
        "num_repeats": 1,
        "license": None,
        **dataset_metrics(rows),
    }


def test_bad_rows_are_named_with_file_line_and_rule(config: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "validation.jsonl", [row("ok"), "{oops", {"question": "no params"}, [1]])
    with pytest.raises(DataError) as error:
        run(config, tmp_path / "out", "train_preparation")
    lines = str(error.value).splitlines()
    path = tmp_path / "validation.jsonl"
    assert [line.split(" ", 2)[:2] for line in lines] == [
        [f"{path}:2:", "[json]"],
        [f"{path}:3:", "[responses-create-params]"],
        [f"{path}:4:", "[json]"],
    ]


def test_missing_dataset_says_how_to_get_it(config: Path, tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").unlink()
    with pytest.raises(DataError, match=r"dataset 'tr' \(train\) of my_agent is missing; fetch it"):
        run(config, tmp_path / "out", "train_preparation")


def test_cli(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            "prepare_data",
            [f"+config_paths=[{config}]", f"+output_dirpath={tmp_path / 'out'}", "+mode=train_preparation"],
        )
        == 0
    )
    assert "train: 6 rows" in capsys.readouterr().out
    assert (
        main("prepare_data", [f"+config_paths=[{config}]", f"+output_dirpath={tmp_path / 'out'}", "+mode=training"])
        == 2
    )
    assert "+mode: Input should be 'train_preparation' or 'example_validation'" in capsys.readouterr().err
