#!/usr/bin/env bash
# Sourced by the tools/gpu_*.sh commands: BUDGET seconds from now, `elapsed` and `left`, `wants PART` (unless SKIP
# names it), $OUT made, the carried binaries in .device/ unpacked, and the GPU named in $OUT/gpu.txt.
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
left() { echo "$(( BUDGET - $(elapsed) ))"; }
wants() { [[ " ${SKIP:-} " != *" $1 "* ]]; }
mkdir -p "$OUT"
(cd .device && for f in *.gz; do [[ -f "$f" ]] && gunzip -f "$f"; done; chmod +x ./* 2>/dev/null)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
