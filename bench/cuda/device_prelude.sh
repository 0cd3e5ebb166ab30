# Sourced by the device run scripts (run_final.sh, run_issue10.sh) after they set P (the carried
# folder of xz-packed binaries and lib/), L (the log folder) and stages: records the device, puts
# the carried libraries and the device's cuBLAS on the library path, unpacks the binaries into
# $BIN, and defines has STAGE and summary NAME RC LOG [LINES].
has() { [[ ",$stages," == *",$1,"* ]]; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; } | tee "$L/env.txt"
CUB=$(dirname "$(find /usr/local/cuda* /usr -name 'libcublas.so.13' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$P/lib:$CUB:${LD_LIBRARY_PATH:-}
BIN=/tmp/vqbin; mkdir -p $BIN
for f in "$P"/*.xz; do b=$BIN/$(basename "$f" .xz); xz -dc "$f" > "$b" 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$f" > "$b"; chmod +x "$b"; done
summary() { echo "$1 exit $2: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$3" | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure|error:" "$3" | head -${4:-15}; }
