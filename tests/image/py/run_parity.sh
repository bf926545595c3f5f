#!/usr/bin/env bash
# CTest driver of the Pillow parity test: image_pillow_parity. Exit 77 (skipped) without the venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
py="$root/.venv-image/bin/python"
if [ ! -x "$py" ]; then
  echo "SKIP: no .venv-image (run tests/image/py/setup_venv.sh)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$py" "$here/pillow_parity.py" "$1" "$work"
