"""A venv on top of a python that has what it has (the GPU image's: CUDA torch, transformers), with no package index.

    python3 benchmarks/gpu/overlay.py [--venv .venv-gpu] [--base-python python3] [--site /tmp/vllm-site] [--wheels .whl]

What it makes, for `benchmarks/gpu/setup.sh` (standard library only: it runs before any venv exists):
- `<venv>/bin/python`: the base python's real interpreter under a `pyvenv.cfg` (a venv as `python -m venv` makes it,
  without pip), so `sys.executable` is `<venv>/bin/python` and every child started with it (ng_run's servers, vLLM's
  workers, DeepSpeed's ranks) is in the same environment;
- `<venv>/lib/pythonX.Y/site-packages/ng_gpu.pth`: this repository, then the `--site` folders (the carried vLLM:
  `/tmp/vllm-site`), then `<venv>/carried`, then the base python's own site-packages (the image may be a venv itself,
  whose packages a `--system-site-packages` venv would not see), each as `site.addsitedir` (their `.pth` files run);
- `<venv>/carried`: the wheels of `--wheels` whose distribution none of those folders has yet (`pip install --target
  --no-deps --no-index`, with the pip of the python running this);
- `<venv>/bin/ng_*`: the console scripts of pyproject.toml, run by `<venv>/bin/python`.
Prints `NOTE:` lines saying what it did. Run again, it starts over.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def norm(name: str) -> str:
    """A distribution's name as packaging normalises it (`Hydra_Core` → `hydra-core`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def base_layout(python: str) -> dict:
    """{"executable": the real interpreter (a venv's base), "version": "3.12", "sites": its site-packages folders}."""
    code = (
        "import json, site, sys; print(json.dumps({'executable': getattr(sys, '_base_executable', sys.executable), "
        "'version': '%d.%d' % sys.version_info[:2], 'sites': site.getsitepackages() + [site.getusersitepackages()]}))"
    )
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def make_venv(venv: Path, base: dict, site_dirs: list[Path]) -> Path:
    """The venv's folders, its interpreter and its .pth (see the module docstring); returns its python."""
    shutil.rmtree(venv, ignore_errors=True)
    site_packages = venv / "lib" / f"python{base['version']}" / "site-packages"
    site_packages.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "carried").mkdir()
    python = venv / "bin" / "python"
    python.symlink_to(base["executable"])
    (venv / "bin" / "python3").symlink_to("python")
    (venv / "pyvenv.cfg").write_text(
        f"home = {Path(base['executable']).parent}\ninclude-system-site-packages = false\nversion = {base['version']}\n"
    )
    lines = [str(REPO)] + [
        f"import site; site.addsitedir({str(folder)!r})"
        for folder in [*site_dirs, venv.resolve() / "carried", *map(Path, base["sites"])]
    ]
    (site_packages / "ng_gpu.pth").write_text("\n".join(lines) + "\n")
    return python


def missing_wheels(python: Path, wheels: list[Path]) -> list[Path]:
    """The wheels whose distribution `python` cannot find yet."""
    code = (
        "import importlib.metadata as m, json; print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()"
        " if d.metadata['Name']})))"
    )
    have = {
        norm(name)
        for name in json.loads(
            subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
        )
    }
    return [wheel for wheel in wheels if norm(wheel.name.split("-")[0]) not in have]


def write_scripts(venv: Path) -> list[str]:
    """`<venv>/bin/<name>` for every console script of pyproject.toml; returns the names."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, function = target.split(":")
        path = venv / "bin" / name
        path.write_text(
            f"#!{venv.resolve() / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\nif __name__ =="
            f" '__main__':\n    sys.exit({function}())\n"
        )
        path.chmod(0o755)
    return list(scripts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-gpu")
    parser.add_argument(
        "--base-python", default=sys.executable, help="the python whose packages the venv sees (default: this one)"
    )
    parser.add_argument(
        "--site",
        type=Path,
        action="append",
        default=[],
        help="a folder of packages that comes first (the carried vLLM); repeatable",
    )
    parser.add_argument("--wheels", type=Path, default=None, help="a folder of wheels to install where missing")
    args = parser.parse_args(argv)
    base = base_layout(args.base_python)
    python = make_venv(args.venv, base, [folder.resolve() for folder in args.site])
    wheels = sorted(args.wheels.glob("*.whl")) if args.wheels else []
    todo = missing_wheels(python, wheels)
    if todo:
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(args.venv / "carried"),
            *map(str, todo),
        ]
        subprocess.run(command, check=True)
    print(
        f"NOTE: {python} on {base['executable']} (Python {base['version']}); {len(todo)} of {len(wheels)} carried"
        f" wheels installed (the others were there); {len(write_scripts(args.venv))} console scripts"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
