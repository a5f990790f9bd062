#!/usr/bin/env bash
# Set up ddprof_nb on a fresh machine and open the quick-start notebook in JupyterLab.
#   bash scripts/demo.sh              # JupyterLab serving notebooks/01-quickstart.ipynb
#   bash scripts/demo.sh --headless   # run the notebook without a browser; write an HTML report
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venvs/demo
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -e ".[notebooks]" 2>&1 | grep -v "^WARNING: Location" || true
if [ "${1:-}" = "--headless" ]; then
    out=${2:-notebooks/out}
    exec "$venv/bin/python" -m ddprof_nb.demo notebooks/01-quickstart.ipynb --out "$out"
fi
exec "$venv/bin/jupyter" lab --ip=127.0.0.1 --no-browser notebooks/01-quickstart.ipynb
