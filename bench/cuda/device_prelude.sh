# Sourced by the device run scripts (run_final.sh, run_issue10.sh) after they set P (the carried
# folder of xz-packed binaries and lib/), L (the log folder) and stages: records the device, puts
# the carried libraries and the device's cuBLAS on the library path, unpacks the binaries into
# $BIN, and defines has STAGE, summary NAME RC LOG [LINES] and gpu_tests (every test binary's GPU
# tests, logs in $L).
has() { [[ ",$stages," == *",$1,"* ]]; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; } | tee "$L/env.txt"
CUB=$(dirname "$(find /usr/local/cuda* /usr -name 'libcublas.so.13' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$P/lib:$CUB:${LD_LIBRARY_PATH:-}
BIN=/tmp/vqbin; mkdir -p $BIN
for f in "$P"/*.xz; do b=$BIN/$(basename "$f" .xz); xz -dc "$f" > "$b" 2>/dev/null || python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$f" > "$b"; chmod +x "$b"; done
summary() { echo "$1 exit $2: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$3" | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure|error:" "$3" | head -${4:-15}; }
# compute-sanitizer memcheck and racecheck on the short device-store run that reaches every
# attention kernel (logs in $L).
sanitizers() {
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $BIN/test_kvcache --gtest_filter='DeviceStore.SmallRunForSanitizers' \
      --gtest_brief=1 > $L/$tool.log 2>&1
    echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/$tool.log | tail -1)"
  done
}
gpu_tests() {
  timeout 150 $BIN/test_ops --gtest_filter='*Cuda*:*cuda*' --gtest_brief=1 > $L/test_ops.log 2>&1; summary test_ops $? $L/test_ops.log
  timeout 200 $BIN/test_kvcache --gtest_filter='*DeviceStore*:VecInferGpu.*:GpuSwitch.*' --gtest_brief=1 > $L/test_kvcache.log 2>&1; summary test_kvcache $? $L/test_kvcache.log
  timeout 200 $BIN/test_model --gtest_filter='*Device*' --gtest_brief=1 > $L/test_model.log 2>&1; summary test_model $? $L/test_model.log
  if [ -x $BIN/test_engine ]; then
    timeout 100 $BIN/test_engine --gtest_filter='*OnTheDevice*:*OnEachDevice*' --gtest_brief=1 > $L/test_engine.log 2>&1; summary test_engine $? $L/test_engine.log
  fi
}
# The device-store tests in 4 processes at once, 3 times each: timing under contention (other
# contexts time-slice the GPU) exposes copies not ordered with our streams; alone they pass.
contention() {
  for j in 1 2 3 4; do
    ( f=0; for i in 1 2 3; do timeout 120 $BIN/test_kvcache --gtest_filter='*DeviceStore*' --gtest_brief=1 > $L/contention$j.$i.log 2>&1 || f=$((f+1)); done
      echo "contention worker $j: $f of 3 runs failed" ) &
  done
  wait
  grep -h -A2 'Failure' $L/contention*.log | grep -E 'nmse|seq |Expected' | head -6
}
