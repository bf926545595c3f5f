#!/usr/bin/env bash
# Creates (or keeps) a Python venv with the pinned packages of a requirements file: the test venvs of
# tests/serve/py and tests/serve/recipe. A venv already made from an identical requirements file is
# kept, so repeated test runs do not reinstall.
# usage: scripts/pinned_venv.sh VENV_DIR REQUIREMENTS_TXT LABEL
set -euo pipefail
venv="$1"
requirements="$2"
label="$3"
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$venv/requirements.installed"; then
  echo "$label venv up to date: $venv"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
cp "$requirements" "$venv/requirements.installed"
echo "$label venv ready: $venv"
