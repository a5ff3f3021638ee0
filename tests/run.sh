#!/usr/bin/env bash
# The whole test suite: installs what the tests need (moto, DuckDB in a
# venv), starts a moto S3 server on 127.0.0.1, runs fmt, clippy and every
# test, and stops the server. Usage: tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
VENV="$CACHE/venv"
mkdir -p "$CACHE"

if ! "$VENV/bin/python" -c 'import moto, duckdb, boto3' 2>/dev/null; then
  echo "== installing moto and duckdb into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    'moto[server]==5.2.5' boto3 duckdb
fi
export SLUICE_PYTHON="$VENV/bin/python"

# A free port on loopback for moto.
PORT="$("$SLUICE_PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$CACHE/moto.log" 2>&1 &
MOTO_PID=$!
trap 'kill $MOTO_PID 2>/dev/null || true; wait $MOTO_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  if "$SLUICE_PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/moto-api/')" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
export SLUICE_S3_ENDPOINT="http://127.0.0.1:$PORT"
export AWS_ENDPOINT_URL="$SLUICE_S3_ENDPOINT"
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true

NODE_DIR="$CACHE/node"
if [ ! -x "$NODE_DIR/node_modules/.bin/asl-validator" ]; then
  echo "== installing asl-validator into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  npm install --silent --no-audit --no-fund --prefix "$NODE_DIR" asl-validator@4 >/dev/null
fi
echo "== asl-validator statemachines/microbatch.asl.json"
"$NODE_DIR/node_modules/.bin/asl-validator" --json-path statemachines/microbatch.asl.json

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
