#!/usr/bin/env bash
# Creates the Python venv of the SDK tests (.venv-serve at the repository root) with the pinned
# openai / anthropic SDKs. About 30 MB from PyPI; CTest skips the SDK tests when it is missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
python3 -m venv "$root/.venv-serve"
"$root/.venv-serve/bin/pip" install --quiet --disable-pip-version-check -r "$(dirname "$0")/requirements.txt"
echo "SDK test venv ready: $root/.venv-serve"
