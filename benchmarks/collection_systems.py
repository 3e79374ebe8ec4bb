"""The systems that `collection_vs_nemo_gym.py` measures on the same work: ours (`Ours`), NeMo Gym 0.4.0 through the
shared harness's driver (`NemoGym04`) and NeMo Gym 0.7.0, the release its users have today (`NemoGym07`), each
behind one interface: `start(index, record=)` (spawn `ng_run`, wait for its ready line, the seconds and the idle RSS),
`collect(...)` (one measured `ng_collect_rollouts`, checked by the caller), `stop()`.

The work, for every system: `ng_run` of `resources_servers/example_single_tool_call` + `simple_agent` +
`openai_model` against the harness's fake policy, then `ng_collect_rollouts` of the same example rows. Each system
runs its own server folders and its own config file of them (0.7.0's: the wheel's, which also declares a
`legacy_agent` environment server that its collector sends the rows through, as 0.7.0 collects them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
DATA = "resources_servers/example_single_tool_call/data/example.jsonl"
CONFIG_PATHS = [
    "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
    "responses_api_models/openai_model/configs/openai_model.yaml",
]
AGENT = "example_single_tool_call_simple_agent"
OUR_GROUPS = {"example_single_tool_call": "gym_resources", AGENT: "gym_agent", "policy_model": "gym_model"}
OURS, THEIRS, THEIRS07, FLOOR = "ours", "nemo_gym_0.4.0", "nemo_gym_0.7.0", "floor_aiohttp"
BIN = Path(sys.executable).parent
# a NeMo Gym server's working folder -> its process group
FOLDER_GROUPS = {
    "resources_servers": "gym_resources",
    "responses_api_agents": "gym_agent",
    "responses_api_models": "gym_model",
    "environment_servers": "gym_environment",
}


class Measured:
    """A system's `ng_run`, kept up as a process group, and its `ng_collect_rollouts` measured by the harness
    (`benchlib.run_measured`): what ours and NeMo Gym 0.7.0 share. A subclass gives its command lines, its
    environment and how its log says that the servers are ready."""

    system = ""
    ready_pattern = ""
    cwd = REPO

    def __init__(self, bl: Any, args: argparse.Namespace, logs: Path, work: Path):
        self.bl, self.args, self.logs, self.work = bl, args, logs, work
        self.group: Any = None
        self.head_url = ""

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def collect_argv(self, out: Path, conc: int, repeats: int) -> list[str]:
        raise NotImplementedError

    def on_ready(self, log: Path) -> None:
        """Called once the log has the ready line (ours reads its head server's URL there)."""

    def start(self, index: int, *, record: bool = True) -> dict[str, Any]:
        """Start ng_run; the seconds from spawn to its ready line, and the idle RSS by process group."""
        log = self.logs / f"{self.system}_ng_run_{index}.log"
        started = time.perf_counter()
        self.group = self.bl.start_group(self.system, self.argv(), log, env=self.env(), cwd=self.cwd)
        self.bl.wait_log(log, [self.ready_pattern], timeout_s=self.args.startup_timeout, alive=self.group.alive)
        t_ready = time.perf_counter() - started
        self.on_ready(log)
        time.sleep(2.0)
        rss: dict[str, int] = {}
        for pid in self.pids():
            try:
                process = psutil.Process(pid)
                label = self.classify(self.system, process)
                rss[label] = rss.get(label, 0) + process.memory_info().rss
            except psutil.Error:  # ended meanwhile
                continue
        idle = {k: round(v / 2**20, 1) for k, v in sorted(rss.items())}
        idle["total"] = round(sum(rss.values()) / 2**20, 1)
        idle["n_procs"] = len(self.pids())
        return {
            "kind": "startup",
            "system": self.system,
            "idx": index,
            "recorded": record,
            "t_ready_s": round(t_ready, 3),
            "idle_rss_mb": idle,
        }

    def pids(self) -> list[int]:
        """ng_run, every process under it (our servers run in sessions of their own) and every process of its
        session (Ray's)."""
        if self.group is None or not self.group.alive():
            return []
        try:
            root = psutil.Process(self.group.pid)
            under = [root.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.Error:
            return []
        return list(dict.fromkeys([*under, *self.group.session_pids()]))

    def classify(self, group: str, process: Any) -> str:
        raise NotImplementedError

    def stop(self) -> dict[str, Any]:
        """SIGINT ng_run (it stops its servers), then SIGKILL any process of the run still alive, by PID."""
        if self.group is None:
            return {}
        children = self.pids()
        info = self.group.stop()
        left = [pid for pid in children if psutil.pid_exists(pid)]
        for pid in left:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        info["leftover_server_pids"] = len(left)
        self.group = None
        return info

    def collect(
        self, conc: int, latency_ms: float, rep: int, repeats: int, tag: str, fake_pids: Any, fake_stats: Any
    ) -> dict[str, Any]:
        n = self.args.rows * repeats
        out = self.work / f"{self.system}_{tag}_c{conc}_l{latency_ms:g}_r{rep}.jsonl"
        marker = out.with_name(out.stem + "_materialized_inputs.jsonl")
        for path in out.parent.glob(out.stem + "*"):
            path.unlink()
        before = fake_stats()
        result = self.bl.run_measured(
            self.collect_argv(out, conc, repeats),
            {self.system: self.pids, "fake": fake_pids},
            classify=self.classify,
            log_path=self.logs / f"{self.system}_collect_{tag}_c{conc}_l{latency_ms:g}_r{rep}.log",
            env=self.env(),
            cwd=self.cwd,
            out_jsonl=out,
            n_expected=n,
            marker_path=marker,
            timeout_s=self.args.collect_timeout,
            client_label="collector",
        )
        after = fake_stats()
        rewards = [json.loads(line).get("reward") for line in out.read_text().splitlines()] if out.exists() else []
        result.update(
            {
                "kind": tag,
                "system": self.system,
                "concurrency": conc,
                "latency_ms": latency_ms,
                "rep": rep,
                "n_rollouts": n,
                "rewards_1": sum(r == 1.0 for r in rewards),
                "model_calls": after["responses"] - before["responses"],
                "rollouts_per_s": round(n / result["wall_s"], 2),
                "cpu_ms_per_rollout": round(1000 * result["cpu_s_total"] / n, 3),
            }
        )
        if result.get("loop_s"):
            result["rollouts_per_s_loop"] = round(n / result["loop_s"], 2)
        for path in out.parent.glob(out.stem + "*"):
            path.unlink()
        return result


class Ours(Measured):
    """Our `ng_run` (servers in their uv environment) and this Python's `ng_collect_rollouts`."""

    system = OURS
    ready_pattern = r"servers ready in"

    def argv(self) -> list[str]:
        return [
            str(BIN / "ng_run"),
            "+config_paths=[" + ",".join(CONFIG_PATHS) + "]",
            f"+policy_base_url=http://127.0.0.1:{self.args.fake_port}/v1",
            "+policy_api_key=dummy-key",
            "+policy_model_name=fake-policy",
            "+head_server.port=0",
        ]

    def on_ready(self, log: Path) -> None:
        self.head_url = re.search(r"Head server: (\S+)", log.read_text()).group(1)

    def collect_argv(self, out: Path, conc: int, repeats: int) -> list[str]:
        return [
            str(BIN / "ng_collect_rollouts"),
            f"+head_server_url={self.head_url}",
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={DATA}",
            f"+output_jsonl_fpath={out}",
            f"+limit={self.args.rows}",
            f"+num_repeats={repeats}",
            f"+num_samples_in_parallel={conc}",
            "+progress=false",
            "+resume=false",
        ]

    def classify(self, group: str, process: Any) -> str:
        if group != OURS:
            return group
        try:
            instance = process.environ().get("NEMO_GYM_INSTANCE")
        except psutil.Error:  # gone or not readable
            return "ng_run+head"
        return OUR_GROUPS.get(instance, "gym_other") if instance else "ng_run+head"


class NemoGym04:
    """NeMo Gym 0.4.0 through the harness's own driver (`ngbench.NemoGym`: its fake policy, its `ng_run` with Ray,
    its collector), with the interface of `Measured`."""

    system = THEIRS

    def __init__(self, ng: Any, args: argparse.Namespace):
        self.ng, self.args = ng, args

    def start(self, index: int, *, record: bool = True) -> dict[str, Any]:
        return {**self.ng.start_ng(index), "system": THEIRS, "recorded": record}

    def stop(self) -> dict[str, Any]:
        return self.ng.ng.stop() if self.ng.ng is not None else {}

    def collect(
        self, conc: int, latency_ms: float, rep: int, repeats: int, tag: str, fake_pids: Any, fake_stats: Any
    ) -> dict[str, Any]:
        return self.ng.collect(conc, latency_ms, rep, self.args.rows, repeats, tag)


class NemoGym07(Measured):
    """NeMo Gym 0.7.0 itself: its `ng_run` of the wheel's config files (Ray included; every server folder runs from
    the 0.7.0 venv, as the peer tests run it: `tests/nemo_gym_peer07.py`, which installs it on first use under
    `$NGBENCH07_DIR`, default /tmp/ngbench07) and its own `ng_collect_rollouts`."""

    system = THEIRS07
    ready_pattern = r"All \d+ / \d+ servers ready"

    def __init__(self, bl: Any, args: argparse.Namespace, logs: Path, work: Path):
        super().__init__(bl, args, logs, work)
        sys.path.insert(0, str(REPO / "tests"))
        import nemo_gym_peer07

        self.peer = nemo_gym_peer07
        self.venv = nemo_gym_peer07.peer07_venv()
        self.cwd = nemo_gym_peer07.peer07_site_packages()  # 0.7.0's config paths are relative to its folders
        self.head_port = args.fake_port + 1

    def argv(self) -> list[str]:
        self.head_url = f"http://127.0.0.1:{self.head_port}"
        return self.peer.nemo_gym07_run_argv(
            CONFIG_PATHS,
            self.head_port,
            f"+policy_base_url=http://127.0.0.1:{self.args.fake_port}/v1",
            "+policy_api_key=dummy-key",
            "+policy_model_name=fake-policy",
        )

    def env(self) -> dict[str, str]:
        return self.peer.peer07_env()

    def collect_argv(self, out: Path, conc: int, repeats: int) -> list[str]:
        return [
            str(self.venv / "bin" / "ng_collect_rollouts"),
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={REPO / DATA}",
            f"+output_jsonl_fpath={out}",
            f"+limit={self.args.rows}",
            f"+num_repeats={repeats}",
            f"+num_samples_in_parallel={conc}",
            "+head_server.host=127.0.0.1",
            f"+head_server.port={self.head_port}",
        ]

    def classify(self, group: str, process: Any) -> str:
        if group != THEIRS07:
            return group
        try:
            if process.pid == self.group.pid:
                return "ng_run+head"
            if "app.py" in " ".join(process.cmdline()):
                parts = Path(process.cwd()).parts
                return next((FOLDER_GROUPS[part] for part in parts if part in FOLDER_GROUPS), "gym_other")
        except psutil.Error:
            pass
        return "ray"
