#!/usr/bin/env bash
# Creates the Python venv of the SDK tests (.venv-serve at the repository root) with the pinned
# openai / anthropic SDKs (about 30 MB from PyPI). scripts/test.sh calls it; a venv already made from
# the same requirements.txt is kept. Without the venv CTest reports the SDK tests as skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/.venv-serve"
if [ -x "$venv/bin/python" ] && cmp -s "$here/requirements.txt" "$venv/requirements.installed"; then
  echo "SDK test venv up to date: $venv"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
cp "$here/requirements.txt" "$venv/requirements.installed"
echo "SDK test venv ready: $venv"
