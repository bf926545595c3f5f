#!/usr/bin/env bash
# Creates the Python venv of the deepseek-recipe oracle (.venv-recipe at the repository root) with
# the pinned packages of requirements.txt (about 45 MB from PyPI). scripts/test.sh calls it. Without
# it CTest reports serve_recipe_corpus as skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
exec "$root/scripts/pinned_venv.sh" "$root/.venv-recipe" "$here/requirements.txt" "deepseek-recipe"
