#!/usr/bin/env bash
# Issue 24 on the device host's cores (CPU only, no GPU used): bench/replicas_load.py, N replicas of
# `veloxquant serve` behind sglang-router with the redis prefix store, beside one replica on one
# replica's share of the cores. That host has no package registry, so what it lacks travels from
# the project machine in an ignored folder $RP, in parts of < 64 MiB, one device call each while
# the machine stays warm (parts land in $R on the host):
#   $RP/p0/smol.0, $RP/p1/smol.1     SmolLM2-135M-Instruct Q4_1 split in two (head -c / tail -c)
#   $RP/p1/veloxquant.xz, $RP/p1/lib  the release CLI (xz) and the Debian libraries it links
#   $RP/p2/*.whl, $RP/p2/extra/*.whl  sglang-router (pip download --no-deps) and, for Python 3.12,
#                                     the imports its launcher needs, each installed only where missing
#   $RP/p2/redis-server, $RP/p2/rlib  Debian's redis binary and the libraries ldd lists for it
# Stages: part0, part1 (copy a part), run (join, install, measure). Load and rows: LOAD_ARGS.
#   bash bench/cuda/run_replicas16.sh part0; ... part1; ... run
set -uo pipefail
RP=${VQ_REPLICA_PARTS:-.gpubin-r}
R=${VQ_REPLICA_HOME:-/root/r}
O=${OUT:-out/replicas16}
mkdir -p "$R" "$O"
case "${1:-run}" in
  part0) cp "$RP"/p0/* "$R"/ && ls -la "$R"; exit ;;
  part1) cp -r "$RP"/p1/* "$R"/ && ls -la "$R"; exit ;;
  run) ;;
  *) echo "run_replicas16.sh: stage '$1' is part0, part1 or run" >&2; exit 2 ;;
esac
set -x
nproc; lscpu | grep -E "Model name|^CPU\(s\)|NUMA node\(s\)"
M=$R/cache/models
mkdir -p "$M" "$R/bin" "$R/py"
[ -s "$M/SmolLM2-135M-Instruct.Q4_1.gguf" ] || cat "$R/smol.0" "$R/smol.1" > "$M/SmolLM2-135M-Instruct.Q4_1.gguf"
sha256sum "$M/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -c1-16
xz -dc "$R/veloxquant.xz" > "$R/veloxquant.real" && chmod +x "$R/veloxquant.real"
cp "$RP/p2/redis-server" "$R/redis-server.real" && chmod +x "$R/redis-server.real"
# wrappers: each binary with its own library path (exec keeps the pid the scripts track)
CUB=$(dirname "$(find /usr/local/cuda* /usr -name 'libcublas.so.13' 2>/dev/null | head -1)")  # a CUDA build links cuBLAS
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib:%s exec %s/veloxquant.real "$@"\n' "$R" "$CUB" "$R" > "$R/bin/veloxquant"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s/redis-server.real "$@"\n' "$PWD/$RP/p2/rlib" "$R" > "$R/bin/redis-server"
chmod +x "$R/bin/veloxquant" "$R/bin/redis-server"
. "$(dirname "$0")/carried_wheels.sh"
install_missing_wheels "$R/py" "$RP"/p2/*.whl "$RP"/p2/extra/*.whl
# the launcher imports the Python mini load balancer, whose imports may be missing here; the
# Rust router does not use it
sed -i 's/^from sglang_router.mini_lb import MiniLoadBalancer$/try:\n    from sglang_router.mini_lb import MiniLoadBalancer\nexcept Exception:  # noqa: BLE001\n    MiniLoadBalancer = None/' \
  "$R/py/sglang_router/launch_router.py"
export PATH=$R/bin:$PATH PYTHONPATH=$R/py VQ_BIN=$R/bin/veloxquant VQ_PYTHON=python3 VQ_CACHE_DIR=$R/cache
"$R/bin/veloxquant" --version || exit 1
python3 -c "import sglang_router.launch_router" || exit 1
set +x
timeout "${LIMIT_S:-540}" python3 bench/replicas_load.py ${LOAD_ARGS:---conversations 32 --turns 3 --system-prompts 8 --system-tokens 768 \
  --user-tokens 48 --max-tokens 32 --replicas 1,4 --threads 4 --configs cache_aware+store --kv-cache kivi2 --kv-budget 2048 \
  --parallel 8} --json "$O/rows.json" --markdown 2>&1 | tail -30
for f in .replicas-bench/*.log; do [ -e "$f" ] && { echo "== $f"; tail -3 "$f"; }; done 2>/dev/null | tail -40
