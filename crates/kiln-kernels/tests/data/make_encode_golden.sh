#!/usr/bin/env bash
# Regenerates encode_golden.bin from llama.cpp's ggml (see encode_golden.c).
#   LLAMA_CPP=/path/to/llama.cpp ./make_encode_golden.sh
# Links the ggml-base library of an existing build of that checkout (build/ by default,
# LLAMA_BUILD to pick another), building just that target if there is none. The golden bytes
# are those of ggml's portable C reference, so build ggml-base without -march flags (the
# default): its quantizers then use no FMA, like kiln's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
lcpp="${LLAMA_CPP:-/tmp/lcpp/src/vendor/llama.cpp}"
build="${LLAMA_BUILD:-$lcpp/build}"
lib="$(find "$build" \( -name 'libggml-base.a' -o -name 'libggml-base.so' \) -print -quit)"
if [ -z "$lib" ]; then
    cmake -S "$lcpp" -B "$build" -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
    cmake --build "$build" --target ggml-base -j
    lib="$(find "$build" -name 'libggml-base.a' -print -quit)"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cc -O2 -ffp-contract=off -std=c11 -Wall -Wextra -I"$lcpp/ggml/include" \
    "$here/encode_golden.c" "$lib" -Wl,-rpath,"$(dirname "$lib")" \
    -lstdc++ -lm -lpthread -fopenmp -o "$tmp/encode_golden"
"$tmp/encode_golden" "$here/encode_golden.bin"
echo "wrote $here/encode_golden.bin ($(stat -c %s "$here/encode_golden.bin") bytes) with $lib"
