#!/usr/bin/env bash
# Runs the Python SDK tests against `cedar serve --scripted` (started by conftest.py).
# Usage: run_sdk_tests.sh PATH/TO/cedar [pytest args]. Exit 77 (CTest: skipped) without the venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
py="$root/.venv-serve/bin/python"
if [ ! -x "$py" ]; then
  echo "SKIP: no SDK test venv at $root/.venv-serve; create it with tests/serve/py/setup_venv.sh"
  exit 77
fi
export CEDAR_BIN="$1"
shift
cd "$here"
exec "$py" -m pytest -q -p no:cacheprovider "$@" .
