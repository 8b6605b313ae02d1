"""Check the built sdist and wheel: their names, metadata and contents.

    python scripts/dist_check.py dist/

Run by scripts/wheel_check.sh after ``python -m build`` and ``twine check``. It fails (exit 1,
each problem on a line) when a file the package ships in the checkout is missing from the wheel
or the sdist (templates, migrations, ``py.typed``, any data file), when the wheel holds files
outside the package, or when the metadata disagrees with ``pyproject.toml``.
"""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from pathlib import Path

import tomllib  # Python 3.11+, as every environment scripts/venv.sh makes

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_sqltasks"
# Files a user's project needs at run time that are not Python modules.
REQUIRED = ["py.typed", "migrations/__init__.py", "migrations/0001_initial.py"]
REQUIRED_SUFFIXES = {".html"}  # the admin's templates
SDIST_EXTRA = ["README.md", "LICENSE", "pyproject.toml"]


def shipped_files() -> list[str]:
    """Return the package's files under version control, as paths inside the repository."""
    out = subprocess.run(
        ["git", "ls-files", "--", PACKAGE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def check_wheel(wheel: Path, project: dict, shipped: list[str]) -> list[str]:
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"django_sqltasks-{project['version']}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    problems += [f"wheel: {path} is missing" for path in shipped if path not in names]
    problems += [
        f"wheel: {PACKAGE}/{path} is missing"
        for path in REQUIRED
        if f"{PACKAGE}/{path}" not in names
    ]
    if not any(Path(name).suffix in REQUIRED_SUFFIXES for name in names):
        problems.append("wheel: no template (.html)")
    strays = sorted(n for n in names if not n.startswith((f"{PACKAGE}/", f"{info}/")))
    problems += [f"wheel: {name} is outside the package" for name in strays]
    if f"{info}/licenses/LICENSE" not in names:
        problems.append("wheel: the LICENSE file is missing")
    problems += check_metadata(metadata, project)
    if "django_sqltasks.testing.pytest_plugin" not in entry_points:
        problems.append("wheel: the pytest11 entry point is missing")
    return problems


def check_metadata(metadata: Message, project: dict) -> list[str]:
    problems = []
    expected = {
        "Name": project["name"],
        "Version": project["version"],
        "Requires-Python": project["requires-python"],
        "License-Expression": project["license"],
    }
    for field, value in expected.items():
        if metadata.get(field) != value:
            problems.append(f"metadata: {field} is {metadata.get(field)!r}, not {value!r}")
    extras = set(metadata.get_all("Provides-Extra") or [])
    declared = set(project["optional-dependencies"])
    if extras != declared:
        problems.append(f"metadata: extras {sorted(extras)}, pyproject.toml has {sorted(declared)}")
    if "bench" in extras:
        problems.append("metadata: bench is a dependency group, not an extra users can install")
    if metadata.get("Description-Content-Type") != "text/markdown":
        problems.append("metadata: the README is not declared as Markdown")
    return problems


def check_sdist(sdist: Path, project: dict, shipped: list[str]) -> list[str]:
    top = f"django_sqltasks-{project['version']}"
    with tarfile.open(sdist) as archive:
        names = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    wanted = [*shipped, *SDIST_EXTRA]
    return [f"sdist: {path} is missing" for path in wanted if path not in names]


def check_version(project: dict) -> list[str]:
    init = (ROOT / PACKAGE / "__init__.py").read_text()
    line = f'__version__ = "{project["version"]}"'
    if line not in init:
        return [f"{PACKAGE}/__init__.py: __version__ differs from pyproject.toml's version"]
    return []


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dist = Path(argv[0])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    version = project["version"]
    wheel = dist / f"django_sqltasks-{version}-py3-none-any.whl"
    sdist = dist / f"django_sqltasks-{version}.tar.gz"
    missing = [str(path) for path in (wheel, sdist) if not path.is_file()]
    if missing:
        print(f"not built: {', '.join(missing)}", file=sys.stderr)
        return 1
    shipped = shipped_files()
    problems = [
        *check_version(project),
        *check_wheel(wheel, project, shipped),
        *check_sdist(sdist, project, shipped),
    ]
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{wheel.name} and {sdist.name}: {len(shipped)} package files each, metadata as declared")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
