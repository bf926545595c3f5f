#!/usr/bin/env bash
# Installs dependencies, builds cedar and runs every test (CTest drives GoogleTest and e2e tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# The pinned Python SDKs the server tests drive (PyPI). Without network the SDK tests are skipped.
tests/serve/py/setup_venv.sh || echo "warning: could not create the SDK test venv; serve_python_sdk will be skipped" >&2
# The pinned deepseek-recipe oracle of the prompt corpus test (PyPI). Without network it is skipped.
tests/serve/recipe/setup_venv.sh || echo "warning: could not create the deepseek-recipe venv; serve_recipe_corpus will be skipped" >&2
# The pinned Pillow of the image processor's parity test (PyPI). Without network it is skipped.
tests/image/py/setup_venv.sh || echo "warning: could not create the Pillow venv; image_pillow_parity will be skipped" >&2
scripts/build.sh
cd "${CEDAR_BUILD_DIR:-build}"
ctest --output-on-failure -j "${CEDAR_JOBS:-$(nproc)}" "$@"
