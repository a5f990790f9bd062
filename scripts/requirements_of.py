"""Print the requirements of this project and some of its extras, one a line, read from
pyproject.toml (the one source of them).

    python scripts/requirements_of.py dev,coexist > reqs.txt
    pip install -r reqs.txt

scripts/test.sh installs every venv's dependencies this way, all venvs at once, before the
project itself is built in each of them one after another: the downloads overlap, and no two
builds of the project share its build/ folder at the same time.
"""

import sys
import tomllib
from pathlib import Path


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text("utf-8"))["project"]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return reqs


if __name__ == "__main__":
    print("\n".join(requirements([e for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e])))
