#!/usr/bin/env bash
# Installs the Debian packages kvserve builds and tests with (idempotent).
set -euo pipefail
PKGS=(cmake ninja-build g++ clang libclang-rt-14-dev pkg-config libgtest-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev libpcre2-dev libssl-dev libboost-dev curl
      libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack
      libsodium-dev libhiredis-dev redis-server chromium python3-websocket libucx-dev tmux python3-jinja2)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# libzmq3-dev, cppzmq-dev, libmsgpack-cxx-dev: KV-cache events (src/events);
# python3-zmq, python3-msgpack: the vLLM-schema subscriber of its tests.
# libsodium-dev: encryption at rest (src/crypto); libhiredis-dev + redis-server:
# the Redis KV tier and the redis-server its tests start.
# chromium, python3-websocket: the dashboard's browser test (DevTools protocol).
# libucx-dev: KV transfers between prefill and decode workers (src/disagg).
# tmux: test_chat_tmux drives `kvserve chat` in a real terminal.
# python3-jinja2: the reference renderer of test_jinja_oracle (chat templates).
# node + npm run the OpenAI SDK conformance test (test_server). Checked by
# command: a NodeSource nodejs ships npm itself and conflicts with Debian's.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
