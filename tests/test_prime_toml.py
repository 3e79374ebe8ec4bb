"""`ng_train @config.toml` (Prime-style TOML): translation, errors with their key paths, the +init template,
and a verifiers-style environment package served through resources_servers/verifiers_env.

The verifiers package itself is not installed here (0.1.x pins datasets / huggingface-hub versions this project
overrides; 0.4 has no `load_environment` API): the environment packages are real package directories on
sys.path written against its classic API (the bundled `vf_reverse_text`, and one written by a test).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml
from ng_process import BIN, NgRun

from nemo_gym.cli import main
from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.config import load_config
from nemo_gym.config.server_instances import server_instances
from nemo_gym.env.testing import assistant_response, post_verify, server_client
from nemo_gym.prime.config import TEMPLATE, PrimeConfig, expand_toml_args, split_toml_args
from nemo_gym.train.config import TrainerConfig

ADAPTER_DIR = REPO_ROOT / "resources_servers" / "verifiers_env"
EXAMPLE_ENVS = ADAPTER_DIR / "example_envs"

FULL_TOML = """
model = "HuggingFaceTB/SmolLM2-135M-Instruct"
max_steps = 7
batch_size = 8
rollouts_per_example = 4
learning_rate = 2e-6

[sampling]
max_tokens = 96
temperature = 0.7

[[env]]
id = "mcqa"
name = "prime-run"
args = { grading_mode = "lenient_boxed" }

[[env]]
id = "someone/vf-reverse-text"
args = { num_train_examples = 6, num_eval_examples = 3 }

[eval]
interval = 3

[[eval.env]]
id = "mcqa"
num_examples = 2
rollouts_per_example = 2

[[eval.env]]
id = "someone/vf-reverse-text"
rollouts_per_example = 4

[wandb]
project = "prime-proj"
entity = "my-team"
"""

MINIMAL = """
max_steps = 2
batch_size = 4
rollouts_per_example = 2

[[env]]
id = "mcqa"
"""


def run_toml(tmp_path: Path, text: str, *extra: str) -> list[str]:
    path = tmp_path / "config.toml"
    path.write_text(textwrap.dedent(text))
    return expand_toml_args([f"@{path}", f"+trainer.output_dir={tmp_path / 'out'}", *extra])


def loaded_trainer(argv: list[str]):
    loaded = load_config(argv)
    server_instances(loaded)  # every instance has its folder and every {type, name} reference resolves
    return loaded, TrainerConfig.model_validate(loaded.values["trainer"])


def test_full_toml_translates_to_a_valid_config(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_ENVS))
    argv = run_toml(tmp_path, FULL_TOML, "+trainer.checkpoint_interval=2")
    assert argv[1:] == [f"+trainer.output_dir={tmp_path / 'out'}", "+trainer.checkpoint_interval=2"]
    loaded, trainer = loaded_trainer(argv)
    values = loaded.values

    # batch_size counts rollouts (prime-rl): 8 rollouts = 2 tasks x 4 rollouts per example
    assert (trainer.num_steps, trainer.batch_size, trainer.group_size) == (7, 2, 4)
    assert trainer.responses_create_params == {"temperature": 0.7, "max_output_tokens": 96}
    assert (trainer.engine.model_path, trainer.engine.temperature, trainer.engine.learning_rate) == (
        "embedded:smollm2",
        0.7,
        2e-6,
    )
    assert values["policy_model"]["responses_api_models"]["vllm_model"]["model"] == "embedded:smollm2"
    assert trainer.checkpoint_interval == 2 and trainer.output_dir == str(tmp_path / "out")
    assert (trainer.logging.wandb.enabled, trainer.logging.wandb.project, trainer.logging.wandb.entity) == (
        True,
        "prime-proj",
        "my-team",
    )
    assert trainer.logging.wandb.name == "prime-run"  # [[env]] name labels the run when [wandb] has none

    assert values["mcqa"]["resources_servers"]["mcqa"]["grading_mode"] == "lenient_boxed"  # args → server fields
    adapter = values["vf_vf_reverse_text"]["resources_servers"]["verifiers_env"]
    assert adapter["env_id"] == "someone/vf-reverse-text" and adapter["env_args"] == {
        "num_train_examples": 6,
        "num_eval_examples": 3,
    }
    assert adapter["python_path"] == [str(EXAMPLE_ENVS)]
    agent = values["vf_vf_reverse_text_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["resources_server"] == {"type": "resources_servers", "name": "vf_vf_reverse_text"}

    train = read_jsonl(Path(trainer.input_jsonl_fpath))
    agents = [row["agent_ref"]["name"] for row in train]
    assert (
        agents == ["mcqa_simple_agent"] * 5 + ["vf_vf_reverse_text_simple_agent"] * 6
    )  # mcqa's example rows (no train set), 6 vf rows
    assert train[-1]["responses_create_params"]["input"][-1]["role"] == "user" and train[-1]["task"] == "reverse-text"

    # eval: rollouts_per_example 2 and 4 → num_repeats = gcd = 2, the vf rows written twice
    assert (trainer.eval.interval, trainer.eval.num_repeats) == (3, 2)
    assert trainer.eval.responses_create_params == {"temperature": 0.7, "max_output_tokens": 96}
    evaluation = read_jsonl(Path(trainer.eval.input_jsonl_fpath))
    assert [row["agent_ref"]["name"] for row in evaluation] == ["mcqa_simple_agent"] * 2 + [
        "vf_vf_reverse_text_simple_agent"
    ] * 6
    assert [row["example_id"] for row in evaluation[2:]] == [0, 0, 1, 1, 2, 2]


def test_translated_verifiers_instance_serves_verify_with_the_rubric_reward(tmp_path, monkeypatch):
    """The adapter instance of a translated config, started as its server (real HTTP routes), scores a
    translated task row with the package's rubric."""
    monkeypatch.syspath_prepend(str(EXAMPLE_ENVS))
    loaded, trainer = loaded_trainer(run_toml(tmp_path, FULL_TOML))
    fields = loaded.values["vf_vf_reverse_text"]["resources_servers"]["verifiers_env"]
    row = read_jsonl(Path(trainer.input_jsonl_fpath))[-1]
    with server_client(ADAPTER_DIR, fields) as client:
        right = post_verify(client, {**row, "response": assistant_response(row["answer"])})
        wrong = post_verify(client, {**row, "response": assistant_response("no idea")})
    assert right["reward"] == 1.0 and right["reward_components"] == {"lcs_reward": 1.0}
    assert 0.0 <= wrong["reward"] < 0.5


BASE = "max_steps = 2\nbatch_size = 4\nrollouts_per_example = 2\n"
ENV = '[[env]]\nid = "mcqa"\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "max_step = 3\n" + ENV, ["unknown key 'max_step'", "did you mean 'max_steps'"]),
        (
            BASE + ENV + "[sampling]\ntemprature = 1.0\n",
            ["unknown key 'sampling.temprature'", "did you mean 'temperature'"],
        ),
        (BASE + '[[env]]\nidd = "mcqa"\n', ["unknown key 'env[0].idd'", "did you mean 'id'"]),
        (
            BASE + ENV + '[eval]\ninterval = 1\n[[eval.env]]\nid = "mcqa"\nnum_example = 2\n',
            ["unknown key 'eval.env[0].num_example'", "did you mean 'num_examples'"],
        ),
        (BASE + ENV + '[wandb]\nprojet = "p"\n', ["unknown key 'wandb.projet'", "did you mean 'project'"]),
        (
            BASE + ENV + "[sampling]\ntemperature = -0.5\n",
            ["key 'sampling.temperature'", "greater than or equal to 0", "-0.5"],
        ),
        (BASE + ENV + "[sampling]\nmax_tokens = 0\n", ["key 'sampling.max_tokens'"]),
        (
            "max_steps = 2\nbatch_size = 6\nrollouts_per_example = 4\n" + ENV,
            ["key 'batch_size'", "multiple of rollouts_per_example = 4", "batch_size = 4"],
        ),
        (
            "max_steps = 2\nbatch_size = 4\nrollouts_per_example = 1\n" + ENV,
            ["key 'rollouts_per_example'", "at least 2"],
        ),
        ("batch_size = 4\nrollouts_per_example = 2\n" + ENV, ["key 'max_steps'", "Field required"]),
        ('max_steps = "ten"\nbatch_size = 4\nrollouts_per_example = 2\n' + ENV, ["key 'max_steps'", "valid integer"]),
        (BASE, ["key 'env'", "Field required"]),
        (
            BASE + '[[env]]\nid = "reasoning_gim"\n',
            ["key 'env[0].id'", "did you mean 'reasoning_gym'", "verifiers environment package"],
        ),
        # PyPI spellings of our environments: reasoning-gym and math-verify are installed packages, not verifiers
        # environments
        (
            BASE + '[[env]]\nid = "reasoning-gym"\n',
            [
                "key 'env[0].id'",
                "has no load_environment()",
                "did you mean our environment 'reasoning_gym'? Write id = \"reasoning_gym\"",
            ],
        ),
        (
            BASE + '[[env]]\nid = "math-verify"\n',
            ["key 'env[0].id'", "did you mean our environment 'math_verify'? Write id = \"math_verify\""],
        ),
        (
            BASE + '[[env]]\nid = "example-multi-step"\n',
            ["key 'env[0].id'", "did you mean our environment 'example_multi_step'"],
        ),
        (BASE + ENV + ENV, ["key 'env[1].id'", "listed twice"]),
        ('model = "Qwen/Qwen3-0.6B"\n' + BASE + ENV, ["key 'model'", "Qwen/Qwen3-0.6B", "local model folder"]),
        ('model = "embedded:gpt5"\n' + BASE + ENV, ["key 'model'", "unknown embedded model"]),
        (BASE + ENV + "[eval]\ninterval = 2\n", ["key 'eval.env'", "no [[eval.env]]"]),
        (BASE + ENV + '[eval]\ninterval = 2\n[[eval.env]]\nid = "nope_env"\n', ["key 'eval.env[0].id'", "'nope_env'"]),
        (
            BASE + '[[env]]\nid = "mcqa"\nargs = { grading_mod = "lenient_boxed" }\n',
            ["key 'env[0].args.grading_mod'", "did you mean 'grading_mode'"],
        ),
        (
            BASE + '[[env]]\nid = "mcqa"\nargs = { grading_mode = "loose" }\n',
            ["key 'env[0].args.grading_mode'", "'loose'"],
        ),
        (BASE + "[[env]\n", ["not valid TOML", "line 4"]),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 40 else None,
)
def test_errors_name_the_toml_key(tmp_path, text, expected):
    with pytest.raises(ConfigError) as info:
        run_toml(tmp_path, text)
    message = str(info.value)
    assert str(tmp_path / "config.toml") in message
    for part in expected:
        assert part in message, message


def test_verifiers_args_are_checked_against_load_environment(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_ENVS))
    with pytest.raises(ConfigError, match=r"key 'env\[0\]\.args\.num_train'.*did you mean 'num_train_examples'"):
        run_toml(tmp_path, BASE + '[[env]]\nid = "vf-reverse-text"\nargs = { num_train = 3 }\n')


def test_temperature_zero_is_accepted_with_a_warning(tmp_path, capsys):
    _, trainer = loaded_trainer(run_toml(tmp_path, BASE + ENV + "[sampling]\ntemperature = 0.0\n"))
    assert trainer.responses_create_params["temperature"] == 0.0 and trainer.engine.temperature == 1.0
    assert "temperature = 0" in capsys.readouterr().err


def test_minimal_toml_defaults_to_the_embedded_model(tmp_path):
    _, trainer = loaded_trainer(run_toml(tmp_path, MINIMAL))
    assert trainer.engine.model_path == "embedded:smollm2" and trainer.eval.interval == 0
    assert trainer.responses_create_params == {"temperature": 1.0, "max_output_tokens": 256}
    assert trainer.logging.wandb.enabled is False


def test_local_model_folder(tmp_path):
    (tmp_path / "my_model").mkdir()
    _, trainer = loaded_trainer(run_toml(tmp_path, 'model = "my_model"\n' + MINIMAL))
    assert trainer.engine.model_path == str(tmp_path / "my_model")  # relative to the TOML's folder


def test_init_template_round_trips(tmp_path, capsys):
    assert main("train", ["+init=true"]) == 0
    template = capsys.readouterr().out
    assert template == TEMPLATE and template.startswith("#")
    tomllib.loads(template)
    for key in PrimeConfig.model_fields:  # every accepted top-level key is shown (some commented out)
        assert (
            f"\n{key} =" in template or f"\n# {key} =" in template or f"[{key}]" in template or f"[[{key}]]" in template
        ), key
    _, trainer = loaded_trainer(run_toml(tmp_path, template))
    assert (trainer.num_steps, trainer.batch_size, trainer.group_size, trainer.eval.interval) == (20, 4, 4, 5)
    assert trainer.engine.model_path == "embedded:smollm2"
    uncommented = template.replace("# [wandb]", "[wandb]").replace('# project = "nemo_gym"', 'project = "nemo_gym"')
    _, trainer = loaded_trainer(run_toml(tmp_path, uncommented))
    assert trainer.logging.wandb.enabled and trainer.logging.wandb.project == "nemo_gym"


def test_cli_reports_a_missing_toml(tmp_path, capsys):
    assert main("train", [f"@{tmp_path / 'nope.toml'}"]) == 2
    assert "nope.toml: TOML file does not exist" in capsys.readouterr().err


def test_split_toml_args_and_merge(tmp_path):
    assert split_toml_args(["@a.toml", "+x=1", "@", "b.toml"]) == ([Path("a.toml"), Path("b.toml")], ["+x=1"])
    (tmp_path / "base.toml").write_text(textwrap.dedent(MINIMAL))
    (tmp_path / "over.toml").write_text("max_steps = 9\n[sampling]\nmax_tokens = 32\n")
    argv = expand_toml_args(
        [f"@{tmp_path / 'base.toml'}", "@", str(tmp_path / "over.toml"), f"+trainer.output_dir={tmp_path / 'out'}"]
    )
    _, trainer = loaded_trainer(argv)
    assert (
        trainer.num_steps == 9
        and trainer.responses_create_params["max_output_tokens"] == 32
        and trainer.group_size == 2
    )


HF_DATASET_PACKAGE = '''
"""A verifiers-style package whose dataset is a datasets.Dataset with a `prompt` column and JSON-string info."""
import json

from datasets import Dataset
from vf_reverse_text._classic import Rubric


class CountEnv:
    max_turns = 1
    message_type = "chat"

    def __init__(self, dataset, rubric):
        self.dataset, self.eval_dataset, self.rubric = dataset, None, rubric

    def get_dataset(self, n=-1):
        return self.dataset

    def get_eval_dataset(self, n=-1):
        return self.dataset


async def right_count(completion, info, **kwargs) -> float:
    return float(completion[-1]["content"].strip() == str(info["count"]))


def load_environment(letter: str = "a"):
    words = ["banana", "apple", "cat"]
    rows = [
        {"prompt": [{"role": "user", "content": f"How many {letter!r} in {w}?"}], "answer": "",
         "info": json.dumps({"count": w.count(letter)})}
        for w in words
    ]
    return CountEnv(Dataset.from_list(rows), Rubric(funcs=[right_count]))
'''


def test_hf_dataset_package_rows_and_verify(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    package = tmp_path / "envs" / "vf_letter_count"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(HF_DATASET_PACKAGE)
    monkeypatch.syspath_prepend(str(EXAMPLE_ENVS))
    monkeypatch.syspath_prepend(str(tmp_path / "envs"))
    _, trainer = loaded_trainer(
        run_toml(tmp_path, BASE + '[[env]]\nid = "me/vf-letter-count"\nargs = { letter = "a" }\n')
    )
    rows = read_jsonl(Path(trainer.input_jsonl_fpath))
    assert [row["info"] for row in rows] == [{"count": 3}, {"count": 1}, {"count": 1}]
    config = {
        "env_id": "me/vf-letter-count",
        "env_args": {"letter": "a"},
        "python_path": [str(EXAMPLE_ENVS), str(tmp_path / "envs")],
    }
    with server_client(ADAPTER_DIR, config) as client:
        assert post_verify(client, {**rows[0], "response": assistant_response("3")})["reward"] == 1.0
        assert post_verify(client, {**rows[0], "response": assistant_response("2")})["reward"] == 0.0


@pytest.mark.long
@pytest.mark.integration
def test_translated_verifiers_env_collects_rollouts_under_ng_run(tmp_path, monkeypatch):
    """The translated config under a real ng_run (the scripted policy in place of vLLM): the adapter server finds
    the package through its python_path, and ng_collect_rollouts scores the translated rows with its rubric."""
    monkeypatch.syspath_prepend(str(EXAMPLE_ENVS))
    argv = run_toml(tmp_path, BASE + '[[env]]\nid = "vf-reverse-text"\nargs = { num_train_examples = 4 }\n')
    config_path = Path(argv[0].removeprefix("+config_paths=[").removesuffix("]"))
    config = yaml.safe_load(config_path.read_text())
    rows = read_jsonl(Path(config["trainer"]["input_jsonl_fpath"]))
    first_text = rows[0]["info"]["text"]
    config.pop("policy_model")
    config["config_paths"] = [p for p in config["config_paths"] if "vllm_model" not in p]
    config["policy_model"] = {
        "responses_api_models": {
            "scripted_model": {
                "entrypoint": "app.py",
                "default_reply": "no idea",
                "rules": [{"match": first_text, "reply": rows[0]["answer"]}],
            }
        }
    }
    scripted_config = tmp_path / "scripted.yaml"
    scripted_config.write_text("# test config\n" + yaml.safe_dump(config))
    out = tmp_path / "rollouts.jsonl"
    with NgRun(f"+config_paths=[{scripted_config}]", timeout_s=600) as run:
        head = run.wait_ready()
        result = subprocess.run(
            [
                str(BIN / "ng_collect_rollouts"),
                f"+head_server_url={head}",
                f"+input_jsonl_fpath={config['trainer']['input_jsonl_fpath']}",
                f"+output_jsonl_fpath={out}",
                "+progress=false",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    rollouts = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["_ng_task_index"])
    assert len(rollouts) == 4 and rollouts[0]["reward"] == 1.0
    assert all(0.0 <= r["reward"] < 1.0 for r in rollouts[1:] if r["info"]["text"] != first_text)
