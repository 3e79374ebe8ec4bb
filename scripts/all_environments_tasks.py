"""Write data/all_environments/examples.jsonl: every environment's data/example.jsonl rows with the agent_ref of
the environment's agent in configs/all_environments.yaml.

    .venv/bin/python scripts/all_environments_tasks.py [--config configs/all_environments.yaml] [--output ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nemo_gym.config import load_config  # noqa: E402
from nemo_gym.config.server_instances import server_instances  # noqa: E402


def tasks(config: Path) -> list[dict]:
    """Example rows of every agent's `example` dataset, each with its agent_ref, in config order."""
    loaded = load_config([f"+config_paths=[{config}]"], resolve=False)
    rows = []
    for instance in server_instances(loaded):
        if instance.server_type != "responses_api_agents":
            continue
        for dataset in instance.fields.get("datasets", []):
            if dataset.get("type") == "example":
                for line in (REPO / dataset["jsonl_fpath"]).read_text().splitlines():
                    if line.strip():
                        rows.append({**json.loads(line), "agent_ref": {"name": instance.name}})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/all_environments.yaml")
    parser.add_argument("--output", type=Path, default=REPO / "data/all_environments/examples.jsonl")
    args = parser.parse_args()
    rows = tasks(args.config)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} rows -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
