"""verifiers_env over HTTP (FastAPI TestClient) with real environment packages on sys.path: the bundled
`vf_reverse_text` and small ones written by the tests (no verifiers install, see vf_reverse_text/__init__.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.env.testing import assistant_response, post_verify, server_client
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
EXAMPLE_ENVS = str(SERVER_DIR / "example_envs")
vf_adapter = import_file(SERVER_DIR / "vf_adapter.py")
prepare = import_file(SERVER_DIR / "prepare.py")


def example_rows() -> list[dict]:
    return read_jsonl(SERVER_DIR / "data" / "example.jsonl")


def test_verify_scores_with_the_rubric():
    row = example_rows()[0]
    with server_client(SERVER_DIR) as client:
        exact = post_verify(client, {**row, "response": assistant_response(row["answer"])})
        half = post_verify(client, {**row, "response": assistant_response(row["answer"][:5])})
        empty = post_verify(client, {**row, "response": assistant_response("")})
    assert exact["reward"] == 1.0 and exact["reward_components"] == {"lcs_reward": 1.0}
    # difflib ratio = 2 * matches / (len(a) + len(b)) = 2 * 5 / (5 + 11) = 0.625
    assert half["reward"] == pytest.approx(0.625)
    assert empty["reward"] == 0.0
    assert exact["answer"] == row["answer"] and exact["example_id"] == row["example_id"]  # row fields kept


def test_env_args_reach_load_environment():
    with server_client(SERVER_DIR, {"env_args": {"system_prompt": "Reverse it."}}) as client:
        env = client.server.env
    assert env.dataset[0]["prompt"][0] == {"role": "system", "content": "Reverse it."}


def test_rows_of_both_splits():
    env = vf_adapter.load_env("vf_reverse_text", {"num_train_examples": 3, "num_eval_examples": 2}, [EXAMPLE_ENVS])
    train, evaluation = vf_adapter.task_rows(env, "train"), vf_adapter.task_rows(env, "eval", limit=1)
    assert len(train) == 3 and len(evaluation) == 1
    assert train[0]["responses_create_params"]["input"][-1]["content"].startswith("Reverse this text: ")
    assert train[0]["answer"] == train[0]["info"]["text"][::-1] and train[0]["task"] == "reverse-text"
    assert evaluation[0]["info"] == env.eval_dataset[0]["info"] and evaluation[0]["example_id"] == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"env_id": "owner/no-such-env"}, "no module 'no_such_env'"),
        ({"env_args": {"num_train": 3}}, r"takes no argument 'num_train' \(did you mean 'num_train_examples'\?\)"),
        (
            {"env_args": {"num_train_examples": "many"}},
            r"load_environment\(\*\*\{'num_train_examples': 'many'\}\) failed: TypeError",
        ),
    ],
)
def test_startup_errors_are_config_errors(config, message):
    with pytest.raises(ConfigError, match=message), server_client(SERVER_DIR, config):
        pass


MULTI_TURN = """
from vf_reverse_text._classic import Rubric

class Game:
    max_turns = 5
    rubric = Rubric()
    dataset = [{"prompt": [{"role": "user", "content": "play"}]}]

def load_environment():
    return Game()
"""


def test_multi_turn_environment_is_refused(tmp_path):
    (tmp_path / "vf_game.py").write_text(MULTI_TURN)
    with pytest.raises(ConfigError, match="runs 5 turns; the adapter serves single-turn environments"):
        vf_adapter.load_env("vf-game", {}, [EXAMPLE_ENVS, str(tmp_path)])


def test_completion_keeps_tool_calls_and_drops_reasoning():
    response = {
        "output": [
            {"type": "reasoning", "id": "rs", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 42."}]},
        ]
    }
    chat = vf_adapter.completion_of(response)
    assert [m["role"] for m in chat] == ["assistant", "tool", "assistant"]
    assert chat[0]["tool_calls"][0]["function"]["name"] == "lookup" and chat[0]["content"] == ""
    assert vf_adapter.completion_of(response, "completion") == "It is 42."


def test_prepare_writes_rows(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    code = prepare.main(["+env_id=vf_reverse_text", "+split=eval", "+limit=5", f"+output_jsonl_fpath={out}"])
    assert code == 0, capsys.readouterr().err
    assert read_jsonl(out) == example_rows()  # data/example.jsonl is this output
    assert prepare.main(["+env_id=vf_reverse_text", "+split=test", f"+output_jsonl_fpath={out}"]) == 2
    assert "+split" in capsys.readouterr().err
