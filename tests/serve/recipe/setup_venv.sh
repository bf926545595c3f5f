#!/usr/bin/env bash
# Creates the Python venv of the deepseek-recipe oracle (.venv-recipe at the repository root) with
# the pinned packages of requirements.txt (about 45 MB from PyPI). scripts/test.sh calls it; a venv
# already made from the same requirements.txt is kept. Without it CTest reports serve_recipe_corpus
# as skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="$root/.venv-recipe"
if [ -x "$venv/bin/python" ] && cmp -s "$here/requirements.txt" "$venv/requirements.installed"; then
  echo "deepseek-recipe venv up to date: $venv"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
cp "$here/requirements.txt" "$venv/requirements.installed"
echo "deepseek-recipe venv ready: $venv"
