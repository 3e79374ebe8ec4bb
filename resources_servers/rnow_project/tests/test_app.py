"""rnow_project on the sample project: tools, and every example row verifying (more in tests/test_rnow.py)."""

from pathlib import Path

from fastapi.testclient import TestClient

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.serving.module_loading import import_file

SERVER_DIR = Path(__file__).resolve().parents[1]
app = import_file(SERVER_DIR / "app.py")


def test_sample_project_tools_and_example_rows():
    server = app.RnowProjectServer({"project_dir": "examples/rnow_project", "max_tool_response_chars": 2000})
    rows = read_jsonl(SERVER_DIR / "data" / "example.jsonl")
    with TestClient(server.build_app()) as client:
        assert {t["name"] for t in client.get("/tools").json()} == {"add", "multiply", "capital"}
        assert client.post("/add", json={"a": 2, "b": 3}).json() == "5"
        for row in rows:
            expected = row["metadata"]["answer"]
            output = [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"Answer: {expected}"}],
                }
            ]
            answer = client.post("/verify", json={**row, "response": {"output": output}}).json()
            assert answer["reward"] == 2.0  # answered + accuracy; used_tool 0 (no tool was called)
