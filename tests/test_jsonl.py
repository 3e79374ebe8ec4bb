"""JSONL helpers: file:line errors, crash-safe appends, repair of a truncated last line."""

from __future__ import annotations

import orjson
import pytest

from nemo_gym.common.errors import DataError
from nemo_gym.common.jsonl import (
    JsonlAppender,
    iter_jsonl,
    iter_lines,
    read_jsonl,
    repair_truncated_tail,
    write_json,
    write_jsonl,
)


def test_read_skips_blank_lines_and_counts_them(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (3, {"a": 2})]
    assert read_jsonl(path, limit=1) == [{"a": 1}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1}\n{"a": \n', "rows.jsonl:2: not valid JSON"),
        ('{"a": 1}\n\n[1, 2]\n', "rows.jsonl:3: expected a JSON object, got a list"),
        ('"text"\n', "rows.jsonl:1: expected a JSON object, got a str"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, text, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        read_jsonl(path)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_limit_stops_before_a_later_bad_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\nnot json\n')
    assert read_jsonl(path, limit=1) == [{"a": 1}]


def test_write_and_append_round_trip(tmp_path):
    path = tmp_path / "sub" / "rows.jsonl"
    write_jsonl(path, [{"a": 1}])
    with JsonlAppender(path) as appender:
        appender.append({"b": "é"})
        assert appender.rows_written == 1
    assert read_jsonl(path) == [{"a": 1}, {"b": "é"}]
    write_json(tmp_path / "m.json", {"x": 1.5})
    assert (tmp_path / "m.json").read_text() == '{\n  "x": 1.5\n}\n'
    assert not list(tmp_path.glob("**/.*tmp*"))


def test_repair_cuts_incomplete_last_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    complete = b'{"a": 1}\n{"a": 2}\n'
    path.write_bytes(complete + b'{"a": 3, "resp')
    assert repair_truncated_tail(path) == len(b'{"a": 3, "resp')
    assert path.read_bytes() == complete
    assert repair_truncated_tail(path) == 0


def test_repair_keeps_complete_last_line_without_newline(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert repair_truncated_tail(path) == 0
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'


def test_repair_single_partial_line_and_long_tail(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": "' + b"x" * 200_000)  # longer than one backwards-read block
    assert repair_truncated_tail(path) == 200_007
    assert path.read_bytes() == b""
    assert repair_truncated_tail(tmp_path / "missing.jsonl") == 0


# U+2028, U+2029 and U+0085: JSON leaves them unescaped inside strings and str.splitlines breaks at them (U+001E too,
# but JSON escapes it)
# (CI once failed reading SmolLM2's rollouts: "Unterminated string" at the U+2028 of a model answer).
SEPARATORS = "a\u2028b\u2029c\x85d\x1ee"


def test_rows_holding_unicode_line_separators_read_whole(tmp_path):
    from nemo_gym.datasets.prepare import read_rows
    from nemo_gym.env.validation import read_jsonl as read_for_validation
    from nemo_gym.rnow.entries import read_entries

    row = {"responses_create_params": {"input": [{"role": "user", "content": SEPARATORS}]}}
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [row, row])
    assert (path.read_bytes().count(b"\n"), len(path.read_text().splitlines())) == (2, 8)
    assert list(iter_lines(path)) == [(1, orjson.dumps(row).decode()), (2, orjson.dumps(row).decode())]
    assert read_jsonl(path) == [row, row]
    assert read_rows(path) == [row, row]
    assert list(read_for_validation(path, "rows.jsonl")) == [(1, row), (2, row)]
    entries = {"messages": [{"role": "user", "content": SEPARATORS}], "rewards": ["r"]}
    write_jsonl(path, [entries])
    assert read_entries(path) == ([(1, entries)], [])
