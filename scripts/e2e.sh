#!/usr/bin/env bash
# End-to-end tests of `kiln serve`: builds the binary, makes a git-ignored .venv with pinned
# official SDKs (once), and runs tests/e2e with pytest. Idempotent; fast on a second run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PINS="pytest==9.2.0 openai==3.57.0 anthropic==2.14.0 jsonschema==4.26.0"
STAMP="$VENV/.kiln-e2e-pins"

if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
if [[ ! -f "$STAMP" ]] || [[ "$(cat "$STAMP")" != "$PINS" ]]; then
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $PINS
  echo "$PINS" > "$STAMP"
fi

# The chat-page test drives Debian's chromium with playwright-core (no browser download). As root
# with apt (CI, these machines) the script installs chromium itself; elsewhere the page test is
# skipped when node or chromium is missing.
if ! command -v chromium >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "e2e: could not install chromium; the page test will be skipped" >&2
fi
PAGE=tests/e2e/page
if command -v npm >/dev/null 2>&1 && [[ ! -d "$PAGE/node_modules/playwright-core" ]]; then
  (cd "$PAGE" && npm ci --no-audit --no-fund --silent) || echo "e2e: could not install playwright-core; the page test will be skipped" >&2
fi

cargo build --quiet -p kiln
export KILN_BIN="${KILN_BIN:-$PWD/target/debug/kiln}"
# Servers started by the tests keep their job store in a throwaway folder, not the user's.
KILN_DATA_DIR="$(mktemp -d /tmp/kiln-e2e-data.XXXXXX)"
export KILN_DATA_DIR
trap 'rm -rf "$KILN_DATA_DIR"' EXIT
"$VENV/bin/python" -m pytest -q tests/e2e "$@"
