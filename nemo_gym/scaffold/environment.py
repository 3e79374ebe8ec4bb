"""`ng_init_environment` (NeMo Gym 0.7.0's `gym env init --environment NAME`): a manifest-backed environment, as
0.7.0 lays one out: the resources server `resources_servers/<name>/` (`ng_init_resources_server`'s working
scaffold) and the catalog folder `environments/<name>/` beside it, holding

- `manifest.yaml`: the environment's catalog entry (0.7.0's schema, `nemo_gym.datasets.manifest`): kind, integration
  profile `custom-gym-verifier`, domain, description, authors, reward range, and the composition it mirrors (resources
  server, agent, model server, datasets);
- `config.yaml`: that composition: the server's config (`config_paths`) with the agent's datasets replaced by the
  environment's own;
- `data/example.jsonl`: the environment's example rows (the server's, to start from);
- `README.md`.

`ng_list_environments` lists it (status experimental), `gym env start --environment <name>` starts it, and NeMo Gym
0.7.0's `gym env validate <name>` accepts it as written.

`ng_init_benchmark` (0.7.0's `gym env init --benchmark NAME`) lays out a benchmark the same way, as 0.7.0's benchmark
scaffold does: an exact-answer resources server (`resources_servers/<name>/`, graded as 0.7.0's scaffold grades: the
final answer's text equals `expected_answer`) and `benchmarks/<name>/` holding a manifest of kind `benchmark`
(`canonical_split` left as a placeholder for its author), `config.yaml` with the one `benchmark` dataset (its
`prepare_script` and `prompt_config`), `prompt.yaml` (the prompt template that builds each row's input from its
`question`), `prepare.py` (its `prepare()` writes the dataset's rows from `data/source.jsonl`; run by
`ng_prepare_benchmark`), `data/source.jsonl` and `data/example.jsonl` (the prepared rows), and `README.md`.
`ng_list_benchmarks` lists it and `gym eval run --benchmark <name>` collects it.

With `+reuse_verifier=<server>` (`--reuse-verifier`), either is graded by an existing resources server instead of a
scaffolded one (`nemo_gym.scaffold.reused_verifier`): nothing is written under resources_servers/, the config takes the
server's config and its agent, and the workload's rows start as the server's example rows; a benchmark's rows then
carry their own input (`prompt_source: prepared`: no prompt.yaml, and prepare.py checks each row has one).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.common.errors import ConfigError
from nemo_gym.common.layout import REPO_ROOT
from nemo_gym.datasets.manifest import load_manifest
from nemo_gym.scaffold.resources_server import (
    EXACT_ANSWER_TEMPLATES,
    TEMPLATES_DIR,
    init_resources_server,
    server_name,
)
from nemo_gym.scaffold.reused_verifier import ReusedVerifier, reused_verifier

__all__ = [
    "InitBenchmarkOptions",
    "InitEnvironmentOptions",
    "init_benchmark",
    "init_benchmark_main",
    "init_environment",
    "init_environment_main",
]


class InitEnvironmentOptions(BaseModel):
    """Parameters of `ng_init_environment`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the environment's name (a Python identifier): environments/<name>/")
    description: str = Field("Word counting with a tool", description="one line on what the environment does")
    domain: str = Field("agent", description="its domain (math, coding, agent, knowledge, games, ...: manifest.yaml)")
    authors: list[str] = Field(default_factory=lambda: ["TODO"], description="who maintains it (manifest.yaml)")
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0), description="the declared inclusive reward range [low, high] (manifest.yaml's reward.range)"
    )
    higher_is_better: bool = Field(True, description="whether a higher reward is better (reward.higher_is_better)")
    reuse_verifier: str | None = Field(
        None, description="an existing resources server (resources_servers/<name>/) to grade it; none is scaffolded"
    )

    @model_validator(mode="after")
    def _ordered_range(self) -> InitEnvironmentOptions:
        if self.reward_range[0] >= self.reward_range[1]:
            raise ValueError(f"reward_range {list(self.reward_range)}: low must be below high")
        return self

    @property
    def said(self) -> str:
        """Its description: as given, else the default of the scaffolded server, or the server it reuses."""
        if self.reuse_verifier and "description" not in self.model_fields_set:
            return f"Graded by the {self.reuse_verifier} resources server"
        return self.description


class InitBenchmarkOptions(InitEnvironmentOptions):
    """Parameters of `ng_init_benchmark`."""

    name: str = Field(description="the benchmark's name (a Python identifier): benchmarks/<name>/")
    description: str = Field("Questions with one exact answer", description="one line on what the benchmark measures")
    domain: str = Field("other", description="its domain (math, coding, agent, knowledge, games, ...: manifest.yaml)")


def _manifest(
    name: str, options: InitEnvironmentOptions, dataset: dict, grader: _Grader, kind: str = "environment"
) -> dict:
    return {
        "name": name,
        "version": "0.1.0",
        "experimental": True,
        "kind": kind,
        "integration_profile": "custom-gym-verifier",
        "domain": options.domain,
        "description": options.said,
        "modality": "text",
        "licensing": "Apache-2.0",
        "authors": options.authors,
        "reward": {"range": list(options.reward_range), "higher_is_better": options.higher_is_better},
        "determinism": "seeded",
        "resources_server": grader.server(name),
        "agent_server": "simple_agent",
        "datasets": [{k: v for k, v in dataset.items() if k != "license"}],
        "model_server": "policy_model",
        "lifecycle": "active",
    }


def _readme(name: str, description: str, grader: _Grader) -> str:
    return (
        f"# {name}\n\n{description}\n\n"
        f"The environment of the resources server `resources_servers/{grader.server(name)}/` (its tools and `verify`),"
        f" with the rows of `data/example.jsonl`. `manifest.yaml` is its catalog entry (`ng_list_environments"
        f" +name={name}`); `config.yaml` its composition.\n\n"
        f"Start it: `gym env start --environment {name} --model-type vllm_model`, then collect rollouts with"
        f" `ng_collect_rollouts +agent_name={grader.agent(name)}"
        f" +input_jsonl_fpath=environments/{name}/data/example.jsonl +output_jsonl_fpath=results/rollouts.jsonl`.\n"
    )


def _scaffold(folder: Path, grader: _Grader, write: Callable[[], None]) -> Path:
    """`folder` once `write` has filled it and its manifest reads as the catalog reads it; on a failure neither
    `folder` nor a scaffolded server is left behind (the error is raised)."""
    try:
        write()
        load_manifest(folder / "manifest.yaml")
    except (ConfigError, OSError):
        shutil.rmtree(folder, ignore_errors=True)
        if grader.folder is not None:
            shutil.rmtree(grader.folder, ignore_errors=True)
        raise
    return folder


def _dataset(name: str, kind: str, tree: str, *, prompted: bool = True) -> dict:
    """The workload's one dataset; a benchmark's names its prepare script and, when `prompted`, its prompt."""
    dataset = {"name": name, "type": kind, "jsonl_fpath": f"{tree}/{name}/data/example.jsonl", "num_repeats": 1}
    if kind == "benchmark":
        dataset["prepare_script"] = f"{tree}/{name}/prepare.py"
        dataset |= {"prompt_config": f"{tree}/{name}/prompt.yaml"} if prompted else {}
    return {**dataset, "license": "Apache 2.0"}


@dataclass(frozen=True)
class _Grader:
    """The resources server of a workload: scaffolded now in `folder`, or `reused` (`folder` is then None)."""

    folder: Path | None
    reused: ReusedVerifier | None = None

    @property
    def examples(self) -> Path:
        return self.reused.examples if self.reused else self.folder / "data" / "example.jsonl"

    def server(self, name: str) -> str:
        """The server's name: resources_servers/<it>/."""
        return self.reused.name if self.reused else name

    def agent(self, name: str) -> str:
        """The workload's agent instance: `<name>_simple_agent`, unless the reused server's agent has that name."""
        taken = self.reused is not None and self.reused.agent_instance == f"{name}_simple_agent"
        return f"{name}_catalog_agent" if taken else f"{name}_simple_agent"  # a name of its own, as 0.7.0

    def config(self, name: str, dataset: dict) -> str:
        """The catalog folder's `config.yaml`: the server's config with its agent's datasets replaced by `dataset`
        (the reused server's agent taken under the workload's name)."""
        if self.reused is None:
            config_paths, agent = [f"resources_servers/{name}/configs/{name}.yaml"], {"datasets": [dataset]}
            entry = {"responses_api_agents": {"simple_agent": agent}}
        else:
            config_paths, entry = [self.reused.config_reference], self.reused.agent_entry(dataset)
        return yaml.safe_dump({"config_paths": config_paths, self.agent(name): entry}, sort_keys=False)


def _new_folder(repo_root: Path, tree: str, options: InitEnvironmentOptions, templates: Path) -> tuple[Path, _Grader]:
    """`(repo_root/tree/<name>, its resources server: scaffolded from `templates`, or the reused one)`.

    Raises:
        ConfigError: see `init_environment`.
    """
    try:
        name = server_name(f"resources_servers/{options.name}")
    except ConfigError as exc:  # named as the user gave it: +name (gym env init --environment/--benchmark NAME)
        raise ConfigError(
            str(exc).replace(f"+entrypoint=resources_servers/{options.name}", f"+name={options.name}")
        ) from None
    folder = repo_root / tree / name
    if folder.exists():
        raise ConfigError(f"{folder} exists already; not overwriting it. Choose another name or delete the folder.")
    if options.reuse_verifier:
        return folder, _Grader(None, reused_verifier(options.reuse_verifier, repo_root))
    server = init_resources_server(
        f"resources_servers/{name}", options.description, repo_root=repo_root, templates=templates
    )
    return folder, _Grader(server)


def init_environment(options: InitEnvironmentOptions, *, repo_root: Path = REPO_ROOT) -> Path:
    """Create `repo_root/environments/<name>/` and its resources server (module docstring). Returns the folder.

    Raises:
        ConfigError: a name that is not a Python identifier, a folder that exists already, or a manifest that breaks
            0.7.0's schema (a domain it does not know, ...); nothing is left behind then.
    """
    folder, grader = _new_folder(repo_root, "environments", options, TEMPLATES_DIR)
    name = folder.name
    dataset = _dataset(name, "example", "environments")

    def write() -> None:
        (folder / "data").mkdir(parents=True)
        shutil.copyfile(grader.examples, folder / "data" / "example.jsonl")
        (folder / "config.yaml").write_text(grader.config(name, dataset))
        manifest = _manifest(name, options, dataset, grader)
        (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
        (folder / "README.md").write_text(_readme(name, options.said, grader))

    return _scaffold(folder, grader, write)


PROMPT = "user: |-\n  Answer the question. Return only the final answer.\n\n  {question}\n"  # the server's rows'


def _prepare_script(name: str, required: tuple[str, ...]) -> str:
    """prepare.py of benchmark `name`: it copies data/source.jsonl to the prepared file, each row checked to have
    `required` (the prompt's and the verifier's fields, or a prepared row's `responses_create_params`)."""
    return dedent(
        f'''\
        """Prepare the rows of the {name} benchmark: data/source.jsonl checked (each row a JSON object with
        {", ".join(required)}) and written to data/example.jsonl, the file its dataset names (jsonl_fpath). Run by
        `ng_prepare_benchmark "+config_paths=[benchmarks/{name}/config.yaml]"` (`gym eval prepare --benchmark {name}`),
        which calls prepare() and checks that it returns that file. Make it your benchmark's own: read or download
        the source, write one JSON object a row with the fields the prompt and the resources server read."""

        import json
        from pathlib import Path

        BENCHMARK_DIR = Path(__file__).parent
        SOURCE_PATH = BENCHMARK_DIR / "data" / "source.jsonl"
        OUTPUT_PATH = BENCHMARK_DIR / "data" / "example.jsonl"
        REQUIRED_FIELDS = {required!r}


        def prepare(source: str | Path = SOURCE_PATH, output: str | Path = OUTPUT_PATH) -> Path:
            """Write the prepared rows to `output`; returns its path. Raises ValueError on a bad source row."""
            source, output = Path(source), Path(output)
            rows = []
            with source.open(encoding="utf-8") as lines:
                for number, line in enumerate(lines, start=1):
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    if not isinstance(row, dict) or any(field not in row for field in REQUIRED_FIELDS):
                        raise ValueError(f"{{source}}:{{number}}: a row needs the fields {{REQUIRED_FIELDS}}")
                    rows.append(row)
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text("".join(json.dumps(row) + "\\n" for row in rows), encoding="utf-8")
            return output


        if __name__ == "__main__":
            print(prepare())
        '''
    )


def _benchmark_readme(name: str, description: str, grader: _Grader) -> str:
    rows = (
        "`prepare.py` writes its rows, `data/example.jsonl`, from `data/source.jsonl`; `prompt.yaml` builds each"
        " row's input from its `question` when the rows are collated."
        if grader.reused is None
        else "`prepare.py` writes its rows, `data/example.jsonl`, from `data/source.jsonl` (at first the server's"
        " example rows, each with its input)."
    )
    return (
        f"# {name}\n\n{description}\n\n"
        f"A benchmark graded by the resources server `resources_servers/{grader.server(name)}/`. {rows}"
        f" `manifest.yaml` is its catalog entry (`ng_list_benchmarks +name={name}`); `config.yaml` its composition.\n\n"
        f"Prepare it: `gym eval prepare --benchmark {name}`. Run it: `gym eval run --benchmark {name} --split benchmark"
        f" --model-type vllm_model --output results/{name}/rollouts.jsonl`, then `ng_reward_profile` on the rollouts.\n"
    )


def init_benchmark(options: InitBenchmarkOptions, *, repo_root: Path = REPO_ROOT) -> Path:
    """Create `repo_root/benchmarks/<name>/` and its exact-answer resources server, or with `reuse_verifier` graded by
    that server (module docstring). Returns the folder.

    Raises:
        ConfigError: as `init_environment`, or a server to reuse that is not there or not reusable
            (`nemo_gym.scaffold.reused_verifier`); nothing is left behind then.
    """
    folder, grader = _new_folder(repo_root, "benchmarks", options, EXACT_ANSWER_TEMPLATES)
    name = folder.name
    prompted = grader.reused is None  # a reused server's rows carry their input
    dataset = _dataset(name, "benchmark", "benchmarks", prompted=prompted)
    rows = [json.loads(line) for line in grader.examples.read_text().splitlines() if line.strip()]
    if prompted:  # the source rows are the fields the prompt and the verifier read
        rows = [{"question": r["question"], "expected_answer": r["expected_answer"]} for r in rows]
    source = "".join(json.dumps(row) + "\n" for row in rows)
    required = ("question", "expected_answer") if prompted else ("responses_create_params",)

    def write() -> None:
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "source.jsonl").write_text(source)
        (folder / "data" / "example.jsonl").write_text(source)  # what prepare.py writes from it
        (folder / "prepare.py").write_text(_prepare_script(name, required))
        (folder / "config.yaml").write_text(grader.config(name, dataset))
        manifest = _manifest(name, options, dataset, grader, kind="benchmark") | {"canonical_split": "TODO"}
        if prompted:
            (folder / "prompt.yaml").write_text(PROMPT)
            manifest["standard_prompt_config"] = dataset["prompt_config"]
        else:
            manifest["prompt_source"] = "prepared"
        (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
        (folder / "README.md").write_text(_benchmark_readme(name, options.said, grader))

    return _scaffold(folder, grader, write)


def _graded_by(name: str, options: InitEnvironmentOptions, scaffolded: str) -> str:
    if options.reuse_verifier:
        return f"    graded by resources_servers/{options.reuse_verifier}/ (reused: nothing written there)"
    return f"    and resources_servers/{name}/ ({scaffolded})"


def init_environment_main(options: InitEnvironmentOptions) -> int:
    """`ng_init_environment`: create it under the current directory (as 0.7.0), print what and the next steps.
    Returns 0 (errors raise)."""
    folder = init_environment(options, repo_root=Path.cwd())
    name = folder.name
    print(f"Created environments/{name}/ (manifest.yaml, config.yaml, data/example.jsonl, README.md)")
    print(_graded_by(name, options, "ng_init_resources_server's scaffold"))
    print("Next steps:")
    print(f"  ng_list_environments +name={name}")
    print(f"  gym env validate {name}      # the manifest against its config and data")
    print(f"  gym env test {name}          # its server's tests and verifier cases")
    print(f"  gym env start --environment {name} --model-type vllm_model")
    print(f"  gym env publish {name}       # once manifest.yaml names its authors")
    return 0


def init_benchmark_main(options: InitBenchmarkOptions) -> int:
    """`ng_init_benchmark`: create it under the current directory (as 0.7.0), print what and the next steps. Returns 0
    (errors raise)."""
    folder = init_benchmark(options, repo_root=Path.cwd())
    name = folder.name
    files = "manifest.yaml, config.yaml, prepare.py, data/, README.md" + (
        "" if options.reuse_verifier else ", prompt.yaml"
    )
    print(f"Created benchmarks/{name}/ ({files})")
    print(_graded_by(name, options, "an exact-answer verifier"))
    print("Next steps:")
    print(f"  edit benchmarks/{name}/prepare.py and data/source.jsonl, and canonical_split in manifest.yaml")
    print(f"  gym eval prepare --benchmark {name}     # runs prepare.py")
    print(f"  gym env validate {name}                 # the manifest against its config and data")
    print(f"  gym env test {name}                     # its server's tests and verifier cases")
    print(f"  gym eval run --benchmark {name} --split benchmark --model-type vllm_model \\")
    print(f"      --output results/{name}/rollouts.jsonl")
    return 0
