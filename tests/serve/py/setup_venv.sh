#!/usr/bin/env bash
# Creates the Python venv of the SDK tests (.venv-serve at the repository root) with the pinned
# openai / anthropic SDKs of requirements.txt (about 30 MB from PyPI). scripts/test.sh calls it.
# Without the venv CTest reports the SDK tests as skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
exec "$root/scripts/pinned_venv.sh" "$root/.venv-serve" "$here/requirements.txt" "SDK test"
