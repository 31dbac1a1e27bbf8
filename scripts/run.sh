#!/usr/bin/env bash
# The main job: build kvserve and serve the default model over the
# OpenAI-compatible HTTP API (../shared stories260K when present, else a
# generated random model). Extra arguments go to `kvserve serve`
# (e.g. -m MODEL --api-keys keys.json); the port is KVSERVE_PORT (default
# 8080). Stop with Ctrl-C or SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
PORT="${KVSERVE_PORT:-8080}"
cat <<MSG
Starting kvserve serve on http://127.0.0.1:${PORT} ... once it prints "listening", try:
  curl -s http://127.0.0.1:${PORT}/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0}'
MSG
exec ./build/kvserve serve --port "${PORT}" "$@"
