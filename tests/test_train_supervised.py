"""Supervised modes of ng_train (nemo_gym.train.supervised): the assistant mask on SmolLM2's real tokenizer, SFT rows
(chat, rollouts, bad rows with file:line), pretrain packing, and sft / pretrain runs of a tiny random Llama whose
loss must drop (a small byte-level BPE tokenizer trained in the test, with SmolLM2's chat template; offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from nemo_gym.common.errors import DataError  # noqa: E402
from nemo_gym.common.jsonl import read_jsonl  # noqa: E402
from nemo_gym.model_servers import tool_calls  # noqa: E402
from nemo_gym.train.batch import collate  # noqa: E402
from nemo_gym.train.config import SupervisedOptions, TrainerConfig  # noqa: E402
from nemo_gym.train.recipes import make_trainer  # noqa: E402
from nemo_gym.train.stopping import run_stoppable  # noqa: E402
from nemo_gym.train.supervised import (  # noqa: E402
    SupervisedRecipe,
    chat_sequence,
    cross_entropy,
    load_sft_sequences,
    pack_documents,
    row_conversation,
)

# SmolLM2-135M-Instruct's chat template (its tokenizer_config.json), for the test tokenizer.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou"
    " are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' +"
    " message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{"
    " '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]
TOOL_CHAT = [
    {"role": "user", "content": "What is 2+2?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "4"},
    {"role": "assistant", "content": "It is 4."},
]


def masked_runs(tokenizer, sequence) -> list[str]:
    """The decoded runs of consecutive mask-1 tokens."""
    runs, current = [], []
    for token, on in zip(sequence.input_ids, sequence.loss_mask):
        if on:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


def test_assistant_mask_on_smollm2_with_a_tool_call_turn(smollm2_tokenizer):
    tok = smollm2_tokenizer
    sequence = chat_sequence(tok, TOOL_CHAT, TOOLS)
    # Exactly the two assistant turns up to and including <|im_end|>: the Hermes tool call (arguments parsed from
    # the JSON string) and the answer; never the system/tools prompt, the user turn, the tool result or "\n".
    assert masked_runs(tok, sequence) == [
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>',
        "It is 4.<|im_end|>",
    ]
    rendered = tool_calls.render_tool_messages(TOOL_CHAT, TOOLS)  # Hermes text, as vllm_model serves the model
    assert tok.decode(sequence.input_ids) == tok.apply_chat_template(rendered, tokenize=False)
    # Token-exact: the mask is 1 from the first token after "<|im_start|>assistant\n" through <|im_end|>.
    ids, mask = sequence.input_ids, sequence.loss_mask
    start_ids = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    starts = [i + len(start_ids) for i in range(len(ids)) if ids[i : i + len(start_ids)] == start_ids]
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    expected = [0] * len(ids)
    for start in starts:
        end = ids.index(end_id, start)
        expected[start : end + 1] = [1] * (end + 1 - start)
    assert len(starts) == 2 and mask == expected


def test_plain_chat_mask_on_smollm2(smollm2_tokenizer):
    plain = chat_sequence(
        smollm2_tokenizer,
        [
            TOOL_CHAT[0],
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6"},
        ],
    )
    assert masked_runs(smollm2_tokenizer, plain) == ["4<|im_end|>", "6<|im_end|>"]


def test_rollout_row_becomes_the_conversation():
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "What is 2+2?"}],
            "tools": [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}],
        },
        "response": {
            "output": [
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "add",
                    "arguments": '{"a": 2, "b": 2}',
                    "generation_token_ids": [1],
                    "prompt_token_ids": [0],
                    "generation_log_probs": [-0.1],
                },
                {"type": "function_call_output", "call_id": "c1", "output": "4"},
                {"type": "reasoning", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 4."}]},
            ]
        },
        "reward": 1.0,
    }
    messages, tools = row_conversation(row)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 2}'}
    assert "generation_token_ids" not in messages[1] and messages[3]["content"] == "It is 4."
    assert tools[0]["function"]["name"] == "add"
    messages, _ = row_conversation({"responses_create_params": {"input": "Hi"}, "completion": "Hello!"})
    assert messages == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]


# -- a tiny model with a small tokenizer -----------------------------------------------------------------------
def chat_rows(count: int) -> list[dict]:
    """Deterministic arithmetic chats: "a+b?" → "a+b=c"."""
    return [
        {"messages": [{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": f"{a}+{b}={a + b}"}]}
        for a in range(count)
        for b in (1, 2)
    ][:count]


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny_chat") / "model"
    texts = [json.dumps(r) for r in chat_rows(32)] + [
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        "the quick brown fox jumps over the lazy dog",
    ]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def test_bad_sft_rows_are_reported_with_file_and_line(tiny_chat_model, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    rows = [
        chat_rows(1)[0],
        {"messages": [{"role": "user", "content": "no answer"}]},
        {"prompt": "x"},
        {"responses_create_params": {"input": "hi"}},
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as info:
        load_sft_sequences(path, tok, SupervisedOptions())
    message = str(info.value)
    assert "3 bad row(s)" in message
    assert f"{path}:2: the conversation has no assistant turn" in message
    assert f"{path}:3: a row needs 'messages'" in message
    assert f"{path}:4: 'responses_create_params' needs the answer" in message
    rollouts = write_jsonl(
        tmp_path / "r.jsonl", [{**chat_rows(1)[0], "reward": 1.0}, {**chat_rows(2)[1], "reward": 0.0}, chat_rows(1)[0]]
    )
    with pytest.raises(DataError, match=r"r.jsonl:3: supervised.min_reward is set but the row has no numeric 'reward'"):
        load_sft_sequences(rollouts, tok, SupervisedOptions(min_reward=0.5))
    kept, stats = load_sft_sequences(
        write_jsonl(tmp_path / "r2.jsonl", [{**chat_rows(1)[0], "reward": 1.0}, {**chat_rows(2)[1], "reward": 0.0}]),
        tok,
        SupervisedOptions(min_reward=0.5),
    )
    assert (len(kept), stats.dropped_reward) == (1, 1)


# A template with tool support (Qwen-style, arguments rendered with `| tojson`), for render_tools_in_prompt false.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}{% endfor %}<|im_end|>\n{% endif %}{%"
    " for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{"
    " c.function.name }} {{ c.function.arguments | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if"
    " add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_tools_get_parsed_json_arguments(tiny_chat_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    tok.chat_template = TOOL_TEMPLATE
    sequence = chat_sequence(tok, TOOL_CHAT, TOOLS, render_tools_in_prompt=False)
    text = tok.decode(sequence.input_ids)
    assert text.startswith("<|im_start|>system\nadd<|im_end|>")  # the tools went to the template
    runs = masked_runs(tok, sequence)  # the JSON-string arguments reach the template as an object
    assert runs == ['<tool_call>add {"a": 2, "b": 2}</tool_call><|im_end|>', "It is 4.<|im_end|>"]


def test_pack_documents_worked_example():
    # stream [1, 2, 3, EOS, 4, 5, EOS] = [1, 2, 3, 0, 4, 5, 0], blocks of 3: [1, 2, 3], [0, 4, 5]; leftover [0] dropped
    assert pack_documents([[1, 2, 3], [4, 5]], eos_token_id=0, block_len=3) == [[1, 2, 3], [0, 4, 5]]
    # blocks of 4: [1, 2, 3, 0], [4, 5, 0] (a shorter last block is kept)
    assert pack_documents([[1, 2, 3], [4, 5]], eos_token_id=0, block_len=4) == [[1, 2, 3, 0], [4, 5, 0]]
    with pytest.raises(ValueError):
        pack_documents([[1]], eos_token_id=0, block_len=1)


def test_cross_entropy_is_the_token_mean():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert cross_entropy(logprobs, mask, num_tokens=3).item() == pytest.approx((1 + 2 + 3) / 3)  # 2.0


def run_mode(model: Path, out: Path, algorithm: str, data: Path, **overrides) -> list[dict]:
    section = {
        "algorithm": algorithm,
        "input_jsonl_fpath": str(data),
        "output_dir": str(out),
        "num_steps": 8,
        "batch_size": 4,
        "engine": {"model_path": str(model), "learning_rate": 1e-2, "micro_batch_size": 2},
        "eval": {"interval": 8, "input_jsonl_fpath": str(data)},
        "logging": {"console": False, "tensorboard": False},
        **overrides,
    }
    trainer = make_trainer(TrainerConfig.model_validate(section), [])
    assert isinstance(trainer.recipe, SupervisedRecipe)
    assert run_stoppable(trainer) == 0
    return read_jsonl(out / "metrics.jsonl")


def test_sft_loss_drops_and_final_model_loads(tiny_chat_model, tmp_path):
    from transformers import AutoModelForCausalLM

    data = write_jsonl(tmp_path / "train.jsonl", chat_rows(8))
    rows = run_mode(tiny_chat_model, tmp_path / "out", "sft", data, checkpoint_interval=4)
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 2 and evals[1] < 0.7 * evals[0], evals  # random init ≈ ln(vocab) ≈ 6; after 8 steps well below
    train = [r for r in rows if r.get("trained")]
    assert len(train) == 8 and train[-1]["loss"] < train[0]["loss"]
    assert (tmp_path / "out" / "checkpoints" / "latest_step").read_text() == "step_000008"
    AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final")


def test_sft_num_epochs_sets_the_steps(tiny_chat_model, tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", chat_rows(6))
    rows = run_mode(tiny_chat_model, tmp_path / "out", "sft", data, supervised={"num_epochs": 2}, eval={"interval": 0})
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # 2 epochs × ceil(6 / 4)


def test_pretrain_loss_drops(tiny_chat_model, tmp_path):
    docs = [{"text": "the quick brown fox jumps over the lazy dog. " * 3} for _ in range(4)]
    data = write_jsonl(tmp_path / "docs.jsonl", docs)
    rows = run_mode(tiny_chat_model, tmp_path / "out", "pretrain", data, supervised={"max_seq_len": 32})
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert evals[1] < 0.7 * evals[0], evals
    with pytest.raises(DataError, match=r"docs2.jsonl:2: needs a non-empty string field 'text'"):
        run_mode(
            tiny_chat_model,
            tmp_path / "out2",
            "pretrain",
            write_jsonl(tmp_path / "docs2.jsonl", [docs[0], {"body": "x"}]),
        )


def test_eval_batch_masks_only_assistant_tokens(tiny_chat_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    sequence = chat_sequence(tok, chat_rows(1)[0]["messages"])
    batch = collate([sequence], [1.0])
    assert batch.num_generated_tokens == sum(sequence.loss_mask[1:]) > 0
    assert tok.decode([t for t, m in zip(sequence.input_ids, sequence.loss_mask) if m]) == "0+1=1<|im_end|>"
