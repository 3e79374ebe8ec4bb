"""`ng_try` on SFT data (an rnow project with `dataset_type: sft`, or `+algorithm=sft`): no rollouts, since nothing is
sampled; each chosen entry is shown as `ng_train +algorithm=sft` will train on it (ReinforceNow's `rnow test` on SFT
entries): the conversation rendered by the model's chat template (tools and tool calls as the Hermes text vllm_model
serves), the trained tokens (the assistant turns, up to their end-of-turn token) told apart from the context, and
the counts: tokens, trained tokens, and what `supervised.max_seq_len` cuts.

The tokenization is the trainer's own (`nemo_gym.train.supervised.row_conversation` and `chat_sequence`), so what is
shown is what is trained. It needs the model's tokenizer: `embedded:smollm2` (converted by the first vllm_model
start) or a local model folder, and the `train` extra (transformers).
Output: the JSON file (`+output=`) holds `{command, created_at, source, model, seed, entries: [{index, where,
num_tokens, num_trained_tokens, max_seq_len, num_cut_tokens, text, trained_text}], failures: [{index, where,
message}]}`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.jsonl import write_json
from nemo_gym.rnow.project import Project, sft_rows

if TYPE_CHECKING:
    from nemo_gym.train.batch import TrainingSequence

__all__ = ["SftEntry", "load_tokenizer", "sft_entry", "entry_panel", "try_sft"]

TRAINED_STYLE = "bold green"


def load_tokenizer(model: str) -> Any:
    """The HF tokenizer (with its chat template) of a resolved model: `embedded:<name>` or a local folder.

    Raises:
        ConfigError: transformers is not installed, the embedded model is not converted yet, or the folder has no
            usable tokenizer.
    """
    try:
        from transformers import AutoTokenizer

        from nemo_gym.train.engine import resolve_model_path
    except ImportError as exc:
        raise ConfigError(
            "ng_try on SFT entries tokenizes them as ng_train does, which needs the train extra: pip install -e"
            f" '.[train]' ({exc})"
        ) from exc
    try:
        return AutoTokenizer.from_pretrained(resolve_model_path(model))
    except FileNotFoundError as exc:
        raise ConfigError(f"ng_try: SFT entries are shown with the model's tokenizer: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ng_try: cannot load the tokenizer of {model}: {exc}") from exc


class SftEntry:
    """One entry as the trainer sees it: token ids, the trained-token mask, and what max_seq_len cuts."""

    def __init__(self, sequence: TrainingSequence, tokenizer: Any, max_seq_len: int):
        self.ids, self.mask = list(sequence.input_ids), list(sequence.loss_mask)
        self.tokenizer, self.max_seq_len = tokenizer, max_seq_len

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    @property
    def num_trained_tokens(self) -> int:
        """Trained tokens within max_seq_len: the assistant tokens the loss sees (the first token is never a target)."""
        return sum(self.mask[1 : self.max_seq_len])

    @property
    def num_cut_tokens(self) -> int:
        return max(0, self.num_tokens - self.max_seq_len)

    def runs(self) -> list[tuple[str, bool]]:
        """The text in runs of trained / not trained tokens (decoded run by run, so multi-byte characters stay
        whole)."""
        runs: list[tuple[str, bool]] = []
        start = 0
        for end in range(1, len(self.ids) + 1):
            if end == len(self.ids) or self.mask[end] != self.mask[start]:
                runs.append((self.tokenizer.decode(self.ids[start:end]), bool(self.mask[start])))
                start = end
        return runs

    def record(self, index: int, where: str) -> dict[str, Any]:
        runs = self.runs()
        return {
            "index": index,
            "where": where,
            "num_tokens": self.num_tokens,
            "num_trained_tokens": self.num_trained_tokens,
            "max_seq_len": self.max_seq_len,
            "num_cut_tokens": self.num_cut_tokens,
            "text": "".join(t for t, _ in runs),
            "trained_text": [t for t, trained in runs if trained],
        }


def sft_entry(row: dict[str, Any], tokenizer: Any, max_seq_len: int) -> SftEntry:
    """One SFT row (`nemo_gym.rnow.project.sft_rows`) tokenized as `ng_train +algorithm=sft` does.

    Raises:
        ValueError: the conversation cannot be rendered or has no assistant turn (the message says which).
    """
    from nemo_gym.train.supervised import chat_sequence, row_conversation

    messages, tools = row_conversation(row)
    return SftEntry(chat_sequence(tokenizer, messages, tools), tokenizer, max_seq_len)


def entry_panel(entry: SftEntry, title: str) -> Panel:
    """The rendered conversation, trained tokens in bold green, then the counts."""
    text = Text()
    for run, trained in entry.runs():
        text.append(run, style=TRAINED_STYLE if trained else "")
    counts = Text(f"{entry.num_tokens} tokens, {entry.num_trained_tokens} trained (", style="bold")
    counts.append("this style", style=TRAINED_STYLE)
    counts.append(": the assistant turns)")
    if entry.num_cut_tokens:
        counts.append(
            f"; supervised.max_seq_len = {entry.max_seq_len} cuts the last {entry.num_cut_tokens} tokens",
            style="bold yellow",
        )
    return Panel(
        Group(text, Text(""), counts),
        title=Text(title, style="bold"),
        title_align="left",
        border_style="blue",
        box=box.ROUNDED,
    )


def try_sft(
    project: Project, model: str, chosen: list[int], *, seed: int, output: Path, console: Console, train_command: str
) -> int:
    """Show the chosen entries of an SFT project and save them to `output`; returns the exit status (1 when an
    entry cannot be tokenized: it is printed as a failure, as the trainer would refuse it). `train_command` is
    printed last: the ng_train command that trains on them.

    Raises:
        ConfigError: see `load_tokenizer`.
    """
    tokenizer = load_tokenizer(model)
    rows, train_file = sft_rows(project), project.config.data.train_file
    max_seq_len = project.context_window(model)
    console.print(
        f"ng_try: {project.root} is SFT data: nothing is sampled; {len(chosen)} of its {len(rows)} entries as ng_train"
        f" +algorithm=sft trains on them (tokenizer of {model}; seed {seed})"
    )
    entries, failures = [], []
    for index in chosen:
        where = f"{train_file}:{rows[index]['rnow_line']}"
        try:
            entry = sft_entry(rows[index], tokenizer, max_seq_len)
        except ValueError as exc:
            failures.append({"index": index, "where": where, "message": str(exc)})
            console.print(
                Panel(
                    Text(str(exc)),
                    title=Text(f"entry {index} ({where}) · cannot be trained", style="bold red"),
                    title_align="left",
                    border_style="red",
                )
            )
            continue
        entries.append(entry.record(index, where))
        console.print(entry_panel(entry, f"entry {index} ({where}) · SFT"))
    record = {
        "command": "ng_try",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": {"rnow_project": str(project.root)},
        "model": model,
        "seed": seed,
        "sft": True,
        "entries": entries,
        "failures": failures,
    }
    write_json(output, record)
    trained = sum(e["num_trained_tokens"] for e in entries)
    console.print(
        f"ng_try: {len(entries)} SFT entr{'y' if len(entries) == 1 else 'ies'} shown ({trained} trained tokens),"
        f" {len(failures)} cannot be trained; saved to {output}. Train: {train_command}"
    )
    return 1 if failures else 0
