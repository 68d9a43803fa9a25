#!/usr/bin/env bash
# The project's test command (README, .ci/run). Installs what it needs, fails on unformatted code
# or any clippy warning, then runs the cold suite: unit and integration tests of every crate, on the real starter model (downloaded once into
# kiln's cache through the same code as `kiln pull`), then the end-to-end suite if present.
# Slow checks live in the `--ignored` tier: see docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs) first" >&2
  exit 1
fi

# The lint gate first: unformatted code or any clippy warning fails the run before the tests.
for tool in rustfmt clippy; do
  if ! cargo "${tool/rustfmt/fmt}" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
      rustup component add "$tool"
    else
      echo "cargo $tool not found: install the $tool component" >&2
      exit 1
    fi
  fi
done
cargo fmt --all --check
cargo clippy --quiet --workspace --all-targets -- -D warnings

# Make the starter model present before the parallel test binaries ask for it (they would wait
# on the download lock anyway; this keeps the progress output in one place).
cargo build --quiet -p kiln
./target/debug/kiln pull --quiet >/dev/null

cargo test --workspace

if [ -x scripts/e2e.sh ]; then
  scripts/e2e.sh
fi
