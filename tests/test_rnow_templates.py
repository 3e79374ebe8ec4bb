"""ReinforceNow projects as a newcomer brings them: ReinforceNow's own templates are written for hub models and
larger context windows, and must run here as they are (offline, on the embedded model). Fast tests on copies of
the sample project shaped like the templates; the e2e test runs the templates of the `rnow` 0.4.37 wheel itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_rnow import GOOD, REPO, SFT_GOOD, make_project

from nemo_gym.common.errors import ConfigError
from nemo_gym.config import load_config
from nemo_gym.model_servers.embedded import context_limit
from nemo_gym.rnow.project import expand_rnow_args, load_project


def model_folder(path: Path, **config: int) -> Path:
    """A local model folder as far as the context checks read it: a config.json."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return path


def translated(run: list[str]) -> dict:
    return load_config(run, cwd=REPO).values


# -- model.path names a hub model (every template) --------------------------------------------------------------
def test_a_hub_model_path_names_the_offline_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = make_project(tmp_path / "p", [GOOD], config={"model.path": "Qwen/Qwen3-8B"})
    with pytest.raises(ConfigError) as raised:
        load_project(root)
    message = str(raised.value)
    assert message.startswith("config.yml: key 'model.path': 'Qwen/Qwen3-8B' is neither an embedded model")
    assert (
        "+model=embedded:smollm2" in message
        and "model.path: embedded:smollm2 in config.yml" in message
        and "+model=<its folder>" in message
    )
    assert "ng_models" in message and "embedded:smollm2" in message.split("ng_models")[-1]  # the models found here
    assert 'model = "' not in message  # no TOML syntax in a config.yml error
    [run] = expand_rnow_args([f"+rnow_project={root}", "+model=embedded:smollm2"], mode="run")  # the fix it names works
    assert translated(run)["policy_model"]["responses_api_models"]["vllm_model"]["model"] == "embedded:smollm2"
    [run] = expand_rnow_args([f"+rnow_project={root}", "+model=embedded:smollm2", "+trainer.num_steps=1"], mode="train")
    assert translated(run)["trainer"]["engine"]["model_path"] == "embedded:smollm2"


def test_a_hub_model_in_a_prime_toml_keeps_the_toml_fix(tmp_path):
    from nemo_gym.prime.config import resolve_model

    with pytest.raises(ConfigError, match='write model = "embedded:smollm2"') as raised:
        resolve_model("Qwen/Qwen3-8B", tmp_path)
    assert "ng_models" in str(raised.value)


# -- rollout.max_context_window above the model's limit ---------------------------------------------------------
def test_context_limit_reads_the_models_config(tmp_path):
    assert context_limit(str(model_folder(tmp_path / "a", max_position_embeddings=256))).tokens == 256
    assert (
        context_limit(str(model_folder(tmp_path / "b", max_position_embeddings=4096, seq_length=2048))).tokens == 2048
    )  # vLLM: the smallest
    assert (
        context_limit(
            str(
                model_folder(
                    tmp_path / "c", rope_scaling={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=256
                )
            )
        )
        is None
    )
    vlm = tmp_path / "d"
    vlm.mkdir()
    (vlm / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 128}, "vision_config": {}}))
    assert context_limit(str(vlm)).tokens == 128
    assert context_limit(str(tmp_path / "none")) is None and context_limit("Qwen/Qwen3-8B") is None
    assert context_limit("embedded:smollm2").tokens == 8192  # converted or not


def test_a_context_window_over_the_models_limit_is_lowered_with_a_warning(tmp_path, monkeypatch, capsys):
    """rnow's templates ask for 16000-32768 tokens; vLLM refuses a max_model_len over the model's limit (after ~23 s,
    with a traceback): the translation lowers it to the limit and says so."""
    monkeypatch.chdir(tmp_path)
    small = model_folder(tmp_path / "small", max_position_embeddings=1024)
    root = make_project(tmp_path / "p", [GOOD], config={"rollout.max_context_window": 16000})
    [run] = expand_rnow_args([f"+rnow_project={root}", f"+model={small}"], mode="run")
    assert translated(run)["policy_model"]["responses_api_models"]["vllm_model"]["max_model_len"] == 1024
    warning = capsys.readouterr().err
    assert (
        f"warning: config.yml: key 'rollout.max_context_window': 16000 tokens is more than {small} takes" in warning
        and "using 1024" in warning
    )
    [run] = expand_rnow_args([f"+rnow_project={root}", "+model=embedded:smollm2"], mode="run")
    assert translated(run)["policy_model"]["responses_api_models"]["vllm_model"]["max_model_len"] == 8192
    long_prompt = make_project(
        tmp_path / "q",
        [{**GOOD, "messages": [{"role": "user", "content": "word " * 1200}]}],
        config={"rollout.max_context_window": 16000},
    )
    with pytest.raises(
        ConfigError,
        match=r"the prompt is \d+ .*longer than rollout.max_context_window = 1024 \(lowered to .*'s limit\)",
    ):
        load_project(long_prompt, [("model.path", str(small))])
    sft = make_project(tmp_path / "s", [SFT_GOOD], config={"rollout.max_context_window": 16000})
    [run] = expand_rnow_args([f"+rnow_project={sft}", f"+model={small}", "+algorithm=sft"], mode="train")
    assert translated(run)["trainer"]["supervised"]["max_seq_len"] == 1024
    capsys.readouterr()
    within = make_project(tmp_path / "w", [GOOD], config={"rollout.max_context_window": 900})
    [run] = expand_rnow_args([f"+rnow_project={within}", f"+model={small}"], mode="run")
    assert (
        translated(run)["policy_model"]["responses_api_models"]["vllm_model"]["max_model_len"] == 900
        and "warning" not in capsys.readouterr().err
    )


def test_vllm_model_refuses_a_max_model_len_over_the_models_limit(tmp_path):
    """Outside rnow projects a too large max_model_len is an error of the config, before vLLM starts."""
    from nemo_gym.config.server_instances import ServerInstance
    from nemo_gym.serving.entrypoint import build_server

    small = model_folder(tmp_path / "small", max_position_embeddings=256)

    def instance(**fields) -> ServerInstance:
        return ServerInstance(
            "policy_model",
            "responses_api_models",
            "vllm_model",
            {"entrypoint": "app.py", "model": str(small), **fields},
            "my.yaml",
        )

    with pytest.raises(ConfigError) as raised:
        build_server(instance(max_model_len=512))
    message = str(raised.value)
    assert message.startswith("my.yaml: key 'policy_model.responses_api_models.vllm_model.max_model_len'")
    assert "512 tokens is more than" in message and "set max_model_len to at most 256" in message
    assert build_server(instance(max_model_len=256)).config.max_model_len == 256
    assert (
        build_server(instance(max_model_len=512, base_url="http://127.0.0.1:9")).config.max_model_len == 512
    )  # attached: not ours to start


# -- output folders ---------------------------------------------------------------------------------------------
def test_two_projects_of_one_name_get_their_own_output_folders(tmp_path, monkeypatch, capsys):
    """rnow's rl-single and tutorial-reward templates are both `project_name: rl-project`: ng_run, ng_train and ng_try
    of one must not write over the other's translated config, tasks, checkpoints or rollouts."""
    from nemo_gym.tryout.options import split_arguments
    from nemo_gym.tryout.sources import rnow_source

    monkeypatch.chdir(tmp_path)
    first, second = (make_project(tmp_path / name, [GOOD]) for name in ("rl-single", "tutorial-reward"))
    for root in (first, second):
        (root / "config.yml").write_text(
            yaml.safe_dump({**yaml.safe_load((root / "config.yml").read_text()), "project_name": "rl-project"})
        )
    runs = [expand_rnow_args([f"+rnow_project={root}"], mode="run")[0][0] for root in (first, second)]
    assert runs[0] != runs[1] and all("/results/rnow/rl-project-" in run for run in runs)
    outputs = {
        translated(expand_rnow_args([f"+rnow_project={root}"], mode="train")[0])["trainer"]["output_dir"]
        for root in (first, second)
    }
    assert len(outputs) == 2 and all(out.startswith("results/train/rl-project-") for out in outputs)
    names = {rnow_source(*split_arguments([f"+rnow_project={root}"])).name for root in (first, second)}
    assert len(names) == 2  # ng_try's default output file results/try/<name>-<time>.json
    assert (
        expand_rnow_args([f"+rnow_project={first}"], mode="run")[0][0] == runs[0]
    )  # the same folder keeps its outputs


# -- SFT projects in ng_try -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tokenizer_folder(tmp_path_factory) -> Path:
    """A model folder with a small byte-level BPE tokenizer and SmolLM2's chat template (no weights: ng_try on SFT
    entries reads only the tokenizer)."""
    from test_train_supervised import SMOLLM2_TEMPLATE
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny_tokenizer") / "model"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    texts = [
        json.dumps(SFT_GOOD),
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        "<tool_call> </tool_call> tools",
    ]
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    tokenizer.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 2048}))
    return path


def test_ng_try_shows_sft_entries_as_the_trainer_tokenizes_them(tmp_path, monkeypatch, capsys, tiny_tokenizer_folder):
    """rnow's sft template (dataset_type: sft, no rewards.py): `rnow test` shows its entries; ng_try said "no
    rewards.py". It shows each entry rendered by the chat template with its trained tokens and counts, starts no server.
    """
    from nemo_gym.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal width (80 without one)
    root = make_project(
        tmp_path / "sft",
        [SFT_GOOD, {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}],
    )
    (root / "rewards.py").unlink()
    (root / "config.yml").write_text(
        yaml.safe_dump({**yaml.safe_load((root / "config.yml").read_text()), "dataset_type": "sft"})
    )
    [run] = expand_rnow_args(
        [f"+rnow_project={root}", f"+model={tiny_tokenizer_folder}"], mode="train"
    )  # ng_train: no rewards.py needed either
    assert translated(run)["trainer"]["algorithm"] == "sft"
    out = tmp_path / "try.json"
    assert main("try", [f"+rnow_project={root}", f"+model={tiny_tokenizer_folder}", "+all=true", f"+output={out}"]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert (
        record["sft"] is True
        and record["failures"] == []
        and [e["where"] for e in record["entries"]] == ["train.jsonl:1", "train.jsonl:2"]
    )
    first, second = record["entries"]
    assert (
        "<tool_call>" in first["text"] and "It is 2." in first["text"] and "$answer" not in first["text"]
    )  # Hermes tool text, variables substituted
    assert any("It is 2.<|im_end|>" in run for run in first["trained_text"]) and not any(
        "What is 1 + 1?" in run for run in first["trained_text"]
    )
    assert second["trained_text"] == ["Hello!<|im_end|>"] and 0 < second["num_trained_tokens"] < second["num_tokens"]
    assert (
        f"{second['num_tokens']} tokens, {second['num_trained_tokens']} trained" in printed
        and "no rewards.py" not in printed
    )
    assert (
        "entry 1 (train.jsonl:2) · SFT" in printed
        and f"ng_train +rnow_project={root} +model={tiny_tokenizer_folder}" in printed
    )
    assert main("try", [f"+rnow_project={root}", "+model=http://127.0.0.1:9/v1"]) == 2
    assert "SFT entries are shown with a model's tokenizer" in capsys.readouterr().err
    (root / "config.yml").write_text(
        yaml.safe_dump({**yaml.safe_load((root / "config.yml").read_text()), "dataset_type": "rl"})
    )
    assert (
        main(
            "try",
            [
                f"+rnow_project={root}",
                f"+model={tiny_tokenizer_folder}",
                "+algorithm=sft",
                "+entries=[1]",
                f"+output={out}",
            ],
        )
        == 0
    )  # +algorithm=sft
    assert f"+model={tiny_tokenizer_folder} +algorithm=sft" in capsys.readouterr().out


# -- a reward that fails in ng_try --------------------------------------------------------------------------------
UNWRITTEN_REWARD = '''
from rnow.core import RewardArgs, reward


@reward
def accuracy(args: RewardArgs, messages: list) -> float:
    """Check if the answer matches the expected answer (rnow's tutorial-reward template: the body is yours to write)."""
    pass
'''


@pytest.mark.long
@pytest.mark.integration
def test_a_failing_reward_shows_and_saves_the_conversation_it_failed_on(tmp_path):
    """rnow's tutorial templates ship rewards whose body is `pass` (returning None): ng_try fails the rollout with
    reward_error, and prints and saves the conversation the reward got, which is what its author needs to fix it."""
    import subprocess

    from test_try import NG_TRY, WIDE

    root = make_project(
        tmp_path / "tutorial-reward",
        [{**GOOD, "messages": [{"role": "user", "content": "What is 17 + 25?"}], "tools": []}],
        rewards=UNWRITTEN_REWARD,
    )
    out = tmp_path / "try.json"
    done = subprocess.run(
        [
            NG_TRY,
            f"+rnow_project={root}",
            f"+config_paths=[{REPO / 'tests/configs/rnow_scripted_policy.yaml'}]",
            "+entries=[0]",
            f"+output={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=WIDE,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    [failure] = json.loads(out.read_text())["failures"]
    assert failure["failure_class"] == "reward_error" and failure["message"].startswith(
        "reward 'accuracy' returned NoneType None"
    )  # the verifier's own message
    assert failure["messages"] == [
        {"role": "user", "content": "What is 17 + 25?"},
        {"role": "assistant", "content": "Answer: 42"},
    ]  # what the reward got
    assert (
        failure["response"]["output"][-1]["content"][0]["text"] == "Answer: 42"
        and failure["responses_create_params"]["input"][0]["content"] == "What is 17 + 25?"
    )
    panel = done.stdout[done.stdout.index("entry 0 (train.jsonl:1)") :]
    assert (
        "What is 17 + 25?" in panel
        and "Answer: 42" in panel
        and panel.index("Answer: 42") < panel.index("FAILED  reward_error")
    )


# -- ReinforceNow's own templates, on the embedded SmolLM2 (e2e) -------------------------------------------------------
RNOW_VERSION = "0.4.37"


@pytest.fixture(scope="module")
def rnow_templates() -> Path:
    """The `rnow/templates` folder of ReinforceNow's PyPI wheel (`uv pip install --no-deps --target`), installed once
    into $NEMO_GYM_HOME/test_cache and reused; never put on sys.path (rnow_project's `rnow.core` aliases serve it)."""
    import shutil
    import subprocess
    import sys

    from nemo_gym.common.layout import nemo_gym_home
    from nemo_gym.orchestration.venvs import uv_executable

    cache = nemo_gym_home() / "test_cache" / f"rnow-{RNOW_VERSION}"
    if not (cache / "rnow" / "templates").is_dir():
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        done = subprocess.run(
            [
                uv_executable(),
                "pip",
                "install",
                "--no-deps",
                "--python",
                sys.executable,
                "--target",
                str(partial),
                f"rnow=={RNOW_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            pytest.skip(f"rnow {RNOW_VERSION} could not be installed from the package registry: {done.stderr[-500:]}")
        partial.rename(cache)
    return cache / "rnow" / "templates"


def ng_try_template(rnow_templates: Path, name: str, tmp_path: Path, *extra: str):
    """ng_try on an unchanged copy of template `name`, from a fresh working folder, on the embedded SmolLM2."""
    import shutil
    import subprocess

    from test_try import NG_TRY, WIDE

    project = shutil.copytree(rnow_templates / name, tmp_path / name)
    out = tmp_path / "try.json"
    done = subprocess.run(
        [
            NG_TRY,
            f"+rnow_project={project}",
            "+model=embedded:smollm2",
            "+entries=[0]",
            "+seed=0",
            f"+output={out}",
            *extra,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=WIDE,
        timeout=1500,
    )
    return done, json.loads(out.read_text()) if out.is_file() else None


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name", ["tutorial-reward", "tutorial-tool"])
def test_rnow_tutorial_templates_run_as_they_are(rnow_templates, name, tmp_path):
    """The tutorial templates (Qwen models, 16000-16384-token windows, rewards and tools whose body is yours to write)
    run unchanged with +model=embedded:smollm2: the window is lowered to SmolLM2's 8192 with a warning, SmolLM2 answers,
    and the unwritten reward fails the rollout with the conversation it got, printed and saved."""
    done, record = ng_try_template(rnow_templates, name, tmp_path, "+responses_create_params={max_output_tokens: 48}")
    assert done.returncode == 1 and record is not None, done.stdout[-4000:] + done.stderr[-4000:]
    assert (
        "ng_try: warning: config.yml: key 'rollout.max_context_window'" in done.stderr and "using 8192" in done.stderr
    )
    [failure] = record["failures"]
    assert failure["failure_class"] == "reward_error" and failure["message"].startswith(
        "reward 'accuracy' returned NoneType None"
    )
    roles = [m["role"] for m in failure["messages"]]
    assert "user" in roles and "assistant" in roles and failure["response"]["model"] == "SmolLM2-135M-Instruct"
    question = next(m["content"] for m in failure["messages"] if m["role"] == "user")
    assert "FAILED  reward_error" in done.stdout and question.split()[0] in done.stdout


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name", ["sft", "off-distill-agent"])
def test_rnow_sft_templates_show_their_entries(rnow_templates, name, tmp_path):
    """rnow's SFT templates (no rewards.py): their entries as SmolLM2's chat template renders them, with trained
    tokens."""
    done, record = ng_try_template(rnow_templates, name, tmp_path)
    assert done.returncode == 0 and record is not None, done.stdout[-4000:] + done.stderr[-4000:]
    [entry] = record["entries"]
    assert (
        entry["where"] == "train.jsonl:1"
        and 0 < entry["num_trained_tokens"] < entry["num_tokens"]
        and entry["text"].startswith("<|im_start|>")
    )
    assert f"{entry['num_tokens']} tokens, {entry['num_trained_tokens']} trained" in done.stdout


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("name", ["rl-single", "rl-tools"])
def test_rnow_rl_templates_with_requirements_run_as_they_are(rnow_templates, name, tmp_path):
    """rl-single (math-verify) and rl-tools (jellyfish, requests, beautifulsoup4, in the project server's environment;
    its web tools fail offline and the model sees their errors) score real rewards on SmolLM2's rollouts, with the
    context window lowered as above."""
    done, record = ng_try_template(rnow_templates, name, tmp_path, "+responses_create_params={max_output_tokens: 48}")
    assert done.returncode == 0 and record is not None, done.stdout[-4000:] + done.stderr[-4000:]
    [row] = record["rollouts"]
    assert 0.0 <= row["reward"] and row["reward_components"]
