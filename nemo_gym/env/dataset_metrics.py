"""The metrics of a dataset's rows, as NeMo Gym's `example_metrics.json` has them (written by `ng_prepare_data`,
checked by `ng_test +should_validate_data=true`).

Number of examples; for the number of tools, of user turns, the JSON-dumped number of words of
`responses_create_params` (a proxy for tokens) and the temperature: the count of non-null values, average, min, max
and sample standard deviation; numeric task fields get the same statistics and text fields their unique and total
counts. Values are rounded to 2 decimals (3 when |x| < 1).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["dataset_metrics", "metrics_path", "summary"]

NON_TASK_KEYS = {"responses_create_params", "response", "agent_ref"}


def summary(values: list[float]) -> dict[str, float | int]:
    """NeMo Gym's statistics of the non-null values: count, average, min, max, sample standard deviation."""
    if not values:
        return {"Total # non-null values": 0, "Average": 0.0, "Min": 0.0, "Max": 0.0, "Standard deviation": 0.0}
    stddev = statistics.stdev(values) if len(values) > 1 else 0.0
    stats = {
        "Average": statistics.fmean(values),
        "Min": float(min(values)),
        "Max": float(max(values)),
        "Standard deviation": stddev,
    }
    return {"Total # non-null values": len(values), **{k: round(v, 2 if abs(v) >= 1 else 3) for k, v in stats.items()}}


def dataset_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of a dataset's rows (see the module docstring); no header fields."""
    tools, turns, words, temperatures = [], [], [], []
    numbers: dict[str, list[float]] = {}
    texts: dict[str, Counter[str]] = {}
    for row in rows:
        params = row["responses_create_params"]
        if params.get("tools") is not None:
            tools.append(len(params["tools"]))
        messages = (
            [{"role": "user", "content": params["input"]}] if isinstance(params["input"], str) else params["input"]
        )
        users = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user")
        if users:
            turns.append(users)
        if params.get("temperature") is not None:
            temperatures.append(float(params["temperature"]))
        words.append(len(json.dumps(params).split()))
        for key, value in row.items():
            if key in NON_TASK_KEYS:
                continue
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, (bool, int, float)):
                    numbers.setdefault(key, []).append(float(item))
                elif isinstance(item, str):
                    texts.setdefault(key, Counter())[item] += 1
    metrics: dict[str, Any] = {
        "Number of examples": len(rows),
        "Number of tools": summary(tools),
        "Json-dumped number of words (proxy for token count)": summary(words),
        "Number of turns": summary(turns),
        "Temperature": summary(temperatures),
    }
    metrics.update({key: summary(values) for key, values in numbers.items()})
    metrics.update({key: {"unique_count": len(c), "total_count": sum(c.values())} for key, c in texts.items()})
    return metrics


def metrics_path(jsonl_path: Path) -> Path:
    """`data/example.jsonl` → `data/example_metrics.json`."""
    return jsonl_path.with_name(f"{jsonl_path.stem}_metrics.json")
