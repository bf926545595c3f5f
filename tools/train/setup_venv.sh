#!/usr/bin/env bash
# Creates the trainer's venv (.venv-train at the repository root) with the pinned packages of
# requirements.txt. Not part of the build or the tests: only retraining cedar-mini needs it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec "$root/scripts/pinned_venv.sh" "$root/.venv-train" "$here/requirements.txt" "cedar-mini trainer"
