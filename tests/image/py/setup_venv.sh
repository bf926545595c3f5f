#!/usr/bin/env bash
# Creates the Python venv of the Pillow parity test (.venv-image at the repository root) with the
# pinned Pillow and numpy of requirements.txt (about 30 MB from PyPI). scripts/test.sh calls it.
# Without the venv CTest reports image_pillow_parity as skipped.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
exec "$root/scripts/pinned_venv.sh" "$root/.venv-image" "$here/requirements.txt" "Pillow parity"
