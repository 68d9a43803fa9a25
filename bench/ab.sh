#!/usr/bin/env bash
# A/B of two builds (or settings) of kiln on one machine whose speed drifts: runs command A,
# then command B, N times, and prints each pair's tokens/second and B/A, then the median and
# mean of the ratios. Each command must be a `kiln bench` invocation (its last table row's
# median column is read).
#
# Usage: bench/ab.sh N 'CMD_A' 'CMD_B'
# Example (parent vs this commit, decode at two threads):
#   cp target/release/kiln /tmp/kiln_new; git stash; cargo build --release -p kiln; ...
#   bench/ab.sh 8 '/tmp/kiln_old bench MODEL -t 2 -p 0 -n 64 -r 2' \
#                 '/tmp/kiln_new bench MODEL -t 2 -p 0 -n 64 -r 2'
set -euo pipefail
if [[ $# -ne 3 || ! "$1" =~ ^[0-9]+$ ]]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
N=$1 A=$2 B=$3
median_of() { eval "$1" 2>&1 | tail -1 | cut -d'|' -f7 | tr -d ' '; }
ratios=""
for _ in $(seq "$N"); do
    a=$(median_of "$A")
    b=$(median_of "$B")
    r=$(python3 -c "print(f'{$b / $a:.3f}')")
    ratios+="$r "
    echo "A $a  B $b  B/A $r"
done
python3 -c "import statistics as s; r = [float(x) for x in '$ratios'.split()]; \
print(f'median B/A {s.median(r):.3f}, mean {s.mean(r):.3f} over {len(r)} pairs')"
