#!/usr/bin/env bash
# The main job: build kvserve and generate from the default model
# (../shared stories260K when present, else a generated random model).
# Extra arguments go to `kvserve generate` (e.g. -m MODEL -p "text").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec ./build/kvserve generate -p "Once upon a time" -n 200 --temp 0 "$@"
