"""`ng_publish_environment` (NeMo Gym 0.7.0's `gym env publish NAME`): the local checks a catalog entry passes before
it is published, as 0.7.0 makes them (`environment.publication.finalize_publication`), nothing started:

1. its manifest checked against its config and data (`gym env validate NAME`, `nemo_gym.datasets.manifest_checks`);
2. its resources server's tests, verifier cases (at least one) and conformance checks pass (`ng_test` of it, in its
   own environment; 0.7.0 runs the app's `VERIFIER_FIXTURE`);
3. no scaffold placeholder is left: a description or author starting with "TODO", licensing `unknown`, a benchmark's
   canonical split or prompt config starting with "TODO";
4. the catalog finds the entry by its name and kind at exactly this manifest, with status experimental or none.

Prints a line of what passed (`+json=true`: 0.7.0's report `{name, version, kind, status, manifest_path,
verifier_cases}`). Returns 0; a failed check raises.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError
from nemo_gym.datasets.catalog import manifest_entry
from nemo_gym.datasets.manifest import load_manifest
from nemo_gym.datasets.manifest_checks import validate_manifest
from nemo_gym.orchestration.folder_tests import run_server_tests

__all__ = ["PublishOptions", "publish_main"]


class PublishOptions(BaseModel):
    """Parameters of `ng_publish_environment`."""

    model_config = ConfigDict(extra="forbid")
    onboarding_name: str = Field(description="the catalog entry to check (its name, as ng_list_environments lists it)")
    catalog_kind: Literal["environment", "benchmark"] | None = Field(
        None, description="its kind, if both have the name"
    )
    json_output: bool = Field(False, alias="json", description="print 0.7.0's JSON report")


def _placeholders(manifest_path: Path) -> list[str]:
    manifest = load_manifest(manifest_path)

    def todo(value: str | None) -> bool:
        return value is not None and value.strip().casefold().startswith("todo")

    found = ["description"] if todo(manifest.description) else []
    found += ["authors"] if any(todo(author) for author in manifest.authors) else []
    found += ["licensing"] if manifest.licensing == "unknown" else []
    if manifest.kind.value == "benchmark":
        found += [k for k in ("canonical_split", "standard_prompt_config") if todo(getattr(manifest, k))]
    return found


def publish_main(options: PublishOptions) -> int:
    """`ng_publish_environment` (module docstring). Returns 0.

    Raises:
        ConfigError: the first check that fails, naming it. DataError: a dataset's (see manifest_checks).
    """
    entry = manifest_entry(options.onboarding_name, options.catalog_kind)
    manifest_path = entry.manifest_path.resolve()
    report = validate_manifest(manifest_path)
    if report.resources_server_dir is None:
        raise ConfigError(f"{options.onboarding_name!r}: its composition has no resources server to check")
    tests = run_server_tests(Path(report.resources_server_dir), stream=False)
    cases = re.search(r"verifier cases: (\d+) passed", tests.log)
    if not tests.ok:
        raise ConfigError(f"{tests.server}: its tests failed:\n" + "\n".join(tests.problems or [tests.log[-3000:]]))
    if not cases or not int(cases.group(1)):
        raise ConfigError(f"{tests.server}: no verifier case passed (tests/verifier_cases.jsonl)")
    if placeholders := _placeholders(manifest_path):
        raise ConfigError(f"{manifest_path}: replace the scaffold's placeholders first: {', '.join(placeholders)}")
    if (entry.name, entry.kind) != (report.name, report.kind) or entry.status not in ("experimental", None):
        raise ConfigError(f"the catalog does not resolve {report.kind} {report.name!r} to {manifest_path}")
    published = {"name": report.name, "version": report.version, "kind": report.kind, "status": entry.status}
    published |= {"manifest_path": str(manifest_path), "verifier_cases": int(cases.group(1))}
    if options.json_output:
        print(json.dumps({k: v for k, v in published.items() if k != "status" or v is not None}))
        return 0
    status = f"catalog status={entry.status} " if entry.status else ""
    print(
        f"✓ Publication checks passed for {report.kind} {report.name} {report.version}; {status}"
        f"({published['verifier_cases']} verifier cases)."
    )
    return 0
