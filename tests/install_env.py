"""jaxformer as a user installs it: a wheel built from this checkout, and fresh virtual
environments outside the source tree, without the network.

A fresh environment sees the test environment's dependencies (jax, orbax, ipykernel, pip, ...)
through a `.pth` file naming a folder of links to them; jaxformer itself is left out of that
folder, so it imports only once the wheel is installed. Python adds a `.pth` file's folders to
`sys.path` without reading the `.pth` files inside them, so the editable install of the test
environment (its finder is started by a `.pth` file) does not leak in either.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

from tests.xla_flags import xla_flags

ROOT = pathlib.Path(__file__).parents[1]
# What building the wheel reads: pyproject.toml (and the README it names) and the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "MANIFEST.in", "jaxformer")
# jaxformer's own entries in site-packages (package, metadata, editable finder) and .pth files.
_NOT_A_DEPENDENCY = re.compile(r"^(jaxformer([-.].*)?|__editable__.*|.*\.pth)$", re.IGNORECASE)


def copy_build_inputs(source: pathlib.Path) -> pathlib.Path:
    """The files a build reads (BUILD_INPUTS), copied from the checkout into `source`."""
    source.mkdir(parents=True, exist_ok=True)
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    return source


def tracked_files(*folders: str) -> list[str]:
    """The checkout's files that git tracks (under `folders`, or all), as paths relative to ROOT;
    a tracked file deleted in the working tree is left out, as a build does not see it."""
    listed = subprocess.run(["git", "ls-files", "-z", *folders], cwd=ROOT, check=True, capture_output=True).stdout
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def build_sdist(directory: pathlib.Path) -> pathlib.Path:
    """jaxformer's source distribution, built into `directory` with the test environment's
    setuptools from a copy of every file git tracks in the checkout (tests, benchmarks and
    notebooks included: what `python -m build --sdist` in a clone sees)."""
    source = directory / "source"
    for name in tracked_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    output = directory / "dist"
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(output)!r}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=source, check=True, capture_output=True, text=True)
    return output / result.stdout.strip().splitlines()[-1]


def build_wheel(directory: pathlib.Path) -> pathlib.Path:
    """Builds jaxformer's wheel into `directory` from a copy of the checkout, offline (the test
    environment's setuptools, no build isolation). A copy, because an in-tree build writes build/
    and *.egg-info into the checkout, and setuptools reuses build/lib: a deleted module would
    stay in later wheels."""
    source = copy_build_inputs(directory / "source")
    output = directory / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", output]
        + [str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = output.glob("jaxformer-*.whl")
    return wheel


def link_dependencies(directory: pathlib.Path) -> pathlib.Path:
    """A folder of links to every entry of the test environment's site-packages but jaxformer's."""
    directory.mkdir(parents=True)
    for folder in dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]):
        for entry in pathlib.Path(folder).iterdir():
            if not _NOT_A_DEPENDENCY.match(entry.name) and not (directory / entry.name).exists():
                (directory / entry.name).symlink_to(entry)
    return directory


@dataclasses.dataclass(frozen=True)
class Shared:
    """What every fresh environment of a test session uses: the wheel and the dependency links."""

    wheel: pathlib.Path
    dependencies: pathlib.Path


def shared_build(root: pathlib.Path) -> Shared:
    """The wheel and the dependency links in `root`, made by the first pytest worker that asks;
    the others wait for it and reuse them."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "jaxformer-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = root / "jaxformer-install.done"
        if done.exists():
            return Shared(pathlib.Path(done.read_text()), root / "dependencies")
        wheel = build_wheel(root / "wheel")
        dependencies = link_dependencies(root / "dependencies")
        done.write_text(str(wheel))
        return Shared(wheel, dependencies)


@dataclasses.dataclass(frozen=True)
class Venv:
    """A virtual environment outside the source tree."""

    path: pathlib.Path

    @property
    def bin(self) -> pathlib.Path:
        return self.path / "bin"

    @property
    def python(self) -> pathlib.Path:
        return self.bin / "python"

    def environment(self, **changes: str) -> dict[str, str]:
        """The environment of a user whose shell has this venv activated: its bin/ first on PATH,
        no PYTHONPATH; one CPU device (unless `changes` say otherwise)."""
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(
            VIRTUAL_ENV=str(self.path),
            PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
            XLA_FLAGS=xla_flags(),
            JAX_PLATFORMS="cpu",
        )
        env.update(changes)
        return env

    def run(self, command: list[str], cwd: pathlib.Path, timeout: float = 300, **env: str):
        return subprocess.run(
            command, cwd=cwd, env=self.environment(**env), capture_output=True, text=True, timeout=timeout
        )


def make_venv(path: pathlib.Path, shared: Shared) -> Venv:
    """A fresh venv at `path` in which the dependencies import and jaxformer does not (yet).
    Made without its own pip (ensurepip takes seconds): the test environment's pip, seen through
    the links, installs into it all the same."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True)
    venv = Venv(path)
    site_packages = subprocess.run(
        [venv.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        env=venv.environment(),
    ).stdout.strip()
    (pathlib.Path(site_packages) / "test-environment-dependencies.pth").write_text(f"{shared.dependencies}\n")
    return venv


def install_wheel(venv: Venv, wheel: pathlib.Path, cwd: pathlib.Path) -> None:
    """`pip install` of the wheel alone: its dependencies are there already; no index is asked."""
    result = venv.run([str(venv.python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd)
    assert result.returncode == 0, result.stdout + result.stderr
