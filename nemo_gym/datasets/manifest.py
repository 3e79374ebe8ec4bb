"""NeMo Gym 0.7.0's environment and benchmark `manifest.yaml`: the typed contract a catalog folder declares
(`environments/<name>/manifest.yaml`, `benchmarks/<name>/manifest.yaml`), read by `nemo_gym.datasets.catalog`.

The fields and their rules are 0.7.0's `nemo_gym.environment.manifest.EnvironmentManifest`: a manifest that breaks
one is not a catalog entry (0.7.0 skips it too). Licences are SPDX expressions, checked with `packaging.licenses`.
"""

from __future__ import annotations

from datetime import date
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import yaml
from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from nemo_gym.common.errors import ConfigError

__all__ = ["Domain", "EnvironmentManifest", "ManifestError", "load_manifest", "manifest_config_path"]

NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Source = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^(?:(?:https?|ssh|git|file)://\S+|[^@\s]+@[^:\s]+:\S+)$")
]
GitRef = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, pattern=r"^[^\s]+$")]
PythonCallable = Annotated[
    str,
    StringConstraints(
        strip_whitespace=True, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
    ),
]
PRIVATE_LICENSES = frozenset({"internal", "proprietary", "unknown"})


class ManifestError(ConfigError):
    """A manifest could not be read, parsed or validated; the message names the file (and the fields)."""


class Domain(StrEnum):
    """The capability an environment trains or evaluates (0.7.0's `config_types.Domain`)."""

    MATH = "math"
    CODING = "coding"
    AGENT = "agent"
    KNOWLEDGE = "knowledge"
    INSTRUCTION_FOLLOWING = "instruction_following"
    LONG_CONTEXT = "long_context"
    SAFETY = "safety"
    GAMES = "games"
    TRANSLATION = "translation"
    E2E = "e2e"
    RLHF = "rlhf"
    OTHER = "other"


class Kind(StrEnum):
    ENVIRONMENT = "environment"
    BENCHMARK = "benchmark"


class IntegrationProfile(StrEnum):
    CUSTOM_GYM_VERIFIER = "custom-gym-verifier"
    CUSTOM_GYM_AGENT_LOOP = "custom-gym-agent-loop"
    EXTERNAL_AGENT_LOOP = "external-agent-loop"
    EXTERNAL_ROLLOUT_DRIVER = "external-rollout-driver"


# the fields each integration profile needs (0.7.0's _PROFILE_REQUIRED_FIELDS)
PROFILE_FIELDS = {
    IntegrationProfile.CUSTOM_GYM_VERIFIER: ("model_server", "resources_server"),
    IntegrationProfile.CUSTOM_GYM_AGENT_LOOP: ("model_server",),
    IntegrationProfile.EXTERNAL_AGENT_LOOP: (),
    IntegrationProfile.EXTERNAL_ROLLOUT_DRIVER: ("rollout_driver",),
}


class Determinism(StrEnum):
    SEEDED = "seeded"
    STOCHASTIC = "stochastic"
    UNKNOWN = "unknown"


class SessionModel(StrEnum):
    EPISODE = "episode"
    STEP = "step"


class EnvironmentState(StrEnum):
    NONE = "none"
    PER_SESSION = "per_session"


class Lifecycle(StrEnum):
    ACTIVE = "active"
    DEPRECATED = "deprecated"


class DatasetKind(StrEnum):
    TRAIN = "train"
    VALIDATION = "validation"
    EXAMPLE = "example"
    BENCHMARK = "benchmark"


class PromptSource(StrEnum):
    TEMPLATE = "template"
    PREPARED = "prepared"
    AGENT = "agent"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, validate_default=True)


class Reward(_Strict):
    range: tuple[FiniteFloat, FiniteFloat] = Field(description="inclusive lower and upper reward")
    higher_is_better: bool

    @model_validator(mode="after")
    def _ordered(self) -> Reward:
        if self.range[0] > self.range[1]:
            raise ValueError("reward.range must be ordered with lower <= upper")
        return self


class ManifestDataset(_Strict):
    name: NonEmpty
    type: DatasetKind
    jsonl_fpath: NonEmpty
    prepare_script: NonEmpty | None = None
    prompt_config: NonEmpty | None = None
    num_repeats: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _benchmark_is_prepared(self) -> ManifestDataset:
        if self.type == DatasetKind.BENCHMARK and self.prepare_script is None:
            raise ValueError("a benchmark dataset requires: prepare_script")
        return self


class AdoptedFrom(_Strict):
    source: Source
    ref: GitRef
    reconciled: date


class EnvironmentManifest(_Strict):
    """One `manifest.yaml`: authored metadata and a mirror of the config's composition (0.7.0's fields and rules)."""

    name: NonEmpty
    version: NonEmpty
    experimental: bool = True
    kind: Kind
    integration_profile: IntegrationProfile
    domain: Domain
    description: NonEmpty
    modality: NonEmpty
    licensing: NonEmpty = "unknown"
    authors: list[NonEmpty] = Field(min_length=1)
    reward: Reward
    determinism: Determinism = Determinism.UNKNOWN
    config_path: NonEmpty = Field("config.yaml", description="the config file, relative to the manifest")
    dataset_owner: NonEmpty | None = None
    resources_server: NonEmpty | None
    agent_server: NonEmpty
    datasets: list[ManifestDataset] = Field(min_length=1)
    model_server: NonEmpty | None = None
    rollout_driver: PythonCallable | None = None
    grading_mode: NonEmpty | None = None
    session_model: SessionModel | None = None
    state: EnvironmentState | None = None
    sandbox: NonEmpty | None = None
    canonical_split: NonEmpty | None = None
    prompt_source: PromptSource = PromptSource.TEMPLATE
    standard_prompt_config: NonEmpty | None = None
    adopted_from: AdoptedFrom | None = None
    lifecycle: Lifecycle = Lifecycle.ACTIVE

    @field_validator("authors")
    @classmethod
    def _unique_authors(cls, value: list[str]) -> list[str]:
        if len(value) != len(set(value)):
            raise ValueError("authors must be unique")
        return value

    @field_validator("licensing")
    @classmethod
    def _spdx(cls, value: str) -> str:
        if value in PRIVATE_LICENSES:
            return value
        try:
            return canonicalize_license_expression(value)
        except InvalidLicenseExpression as exc:
            raise ValueError("licensing must be an SPDX license expression, internal, proprietary, or unknown") from exc

    @model_validator(mode="after")
    def _contract(self) -> EnvironmentManifest:
        missing = [name for name in PROFILE_FIELDS[self.integration_profile] if getattr(self, name) is None]
        if self.kind == Kind.BENCHMARK:
            missing += ["canonical_split"] if self.canonical_split is None else []
            if self.prompt_source == PromptSource.TEMPLATE and self.standard_prompt_config is None:
                missing.append("standard_prompt_config")
        if missing:
            raise ValueError("manifest requires: " + ", ".join(dict.fromkeys(missing)))
        if self.prompt_source == PromptSource.PREPARED and self.standard_prompt_config is not None:
            raise ValueError("standard_prompt_config is forbidden for prepared prompts")
        if self.prompt_source != PromptSource.TEMPLATE and any(d.prompt_config is not None for d in self.datasets):
            raise ValueError("dataset.prompt_config is only valid for template prompts")
        if self.integration_profile != IntegrationProfile.EXTERNAL_ROLLOUT_DRIVER and self.rollout_driver is not None:
            raise ValueError("rollout_driver is only valid for the external-rollout-driver profile")
        names = [d.name for d in self.datasets]
        if len(names) != len(set(names)):
            raise ValueError("dataset names must be unique")
        if self.kind == Kind.BENCHMARK and not any(d.type == DatasetKind.BENCHMARK for d in self.datasets):
            raise ValueError("a benchmark manifest requires a benchmark dataset")
        return self


def load_manifest(path: Path) -> EnvironmentManifest:
    """The manifest at `path`.

    Raises:
        ManifestError: the file is unreadable, not YAML, not a mapping, or breaks a field's rule (each one named as
            `field.subfield: message`).
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError) as exc:
        raise ManifestError(f"{path}: cannot read the manifest: {exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ManifestError(f"{path}: malformed YAML{where}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: a manifest is a YAML mapping")
    try:
        return EnvironmentManifest.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"  - {'.'.join(map(str, e['loc'])) or 'manifest'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
        raise ManifestError(f"{path}: invalid manifest:\n" + "\n".join(problems)) from exc


def manifest_config_path(manifest_path: Path, manifest: EnvironmentManifest) -> Path:
    """The config file a manifest names: relative to the manifest's folder, and inside its `benchmarks/` or
    `environments/` tree once links are resolved (the manifest's own folder when it is in neither).

    Raises:
        ManifestError: `config_path` is absolute or leads out of the tree.
    """
    path = manifest_path.absolute()
    if Path(manifest.config_path).is_absolute():
        raise ManifestError(f"{path}: config_path must be relative")
    tree = next((p for p in path.parents if p.name in {"benchmarks", "environments"}), path.parent)
    resolved = (path.parent / manifest.config_path).resolve()
    if not resolved.is_relative_to(tree.resolve()):
        raise ManifestError(f"{path}: config_path leads out of the catalog tree {tree}")
    return resolved
