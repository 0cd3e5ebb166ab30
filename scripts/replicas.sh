#!/usr/bin/env bash
# N replicas of `veloxquant serve` behind SGLang's router (sglang-router from PyPI, its cache-aware
# policy by default) and, unless --no-store, one redis-server as the shared compressed prefix store
# (issue 24). One command brings it up, one takes it down:
#
#   scripts/replicas.sh up [-n N] [--port P] [--policy cache_aware|round_robin|random|power_of_two]
#                          [--no-store] [--kv-events] [--threads T] [--kv-cache SPEC] [--kv-budget MIB]
#                          [--parallel K] [-m MODEL] [--dir RUN_DIR] [-- extra serve flags...]
#   scripts/replicas.sh down [--dir RUN_DIR]
#   scripts/replicas.sh status [--dir RUN_DIR]
#
# The router listens on 127.0.0.1:P (8000), replica i on P+1+i, redis on P+100; replica i gets T
# threads (default: the cores split evenly) pinned to its own cores with taskset, so replicas do not
# fight over cores. --kv-events: replica i publishes vLLM-format KV events on ipc://RUN_DIR/kv-i.pub
# (replay on ipc://RUN_DIR/kv-i.replay). Logs and pids live in RUN_DIR (default .replicas/).
# Everything listens on loopback only. A replica that dies is taken out of the rotation after 2
# failed sends (the router's circuit breaker; its default of 10 is more than the 5 tries a request
# gets, and the cache-aware policy keeps sending a prompt to the replica that holds its prefix, so a
# request could spend all its tries on the dead one), retried after 10 s; health checks every 5 s.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:-}
[ -n "$cmd" ] && shift
n=2 port=8000 policy=cache_aware store=1 kv_events=0 threads=0 kv_cache="vecinfer:d4b8" kv_budget=1024 parallel=8
model="" dir=.replicas extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --policy) policy=$2; shift 2 ;;
    --no-store) store=0; shift ;;
    --kv-events) kv_events=1; shift ;;
    --threads) threads=$2; shift 2 ;;
    --kv-cache) kv_cache=$2; shift 2 ;;
    --kv-budget) kv_budget=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    -m) model=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "replicas.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
BIN=${VQ_BIN:-build/release/tools/veloxquant/veloxquant}
PY=${VQ_PYTHON:-.venv/bin/python}

stop_pid() {  # SIGTERM, then SIGKILL after 20 s
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  [ -d "$dir" ] || { echo "replicas.sh: nothing running ($dir absent)"; return 0; }
  stop_pid "$dir/router.pid"
  for f in "$dir"/replica-*.pid; do [ -e "$f" ] && stop_pid "$f"; done
  stop_pid "$dir/redis.pid"
  echo "replicas.sh: stopped (logs in $dir)"
}

http_ok() {  # URL answers 2xx (curl, else Python)
  if command -v curl >/dev/null; then
    curl -sf -o /dev/null "$1"
  else
    "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null
  fi
}

wait_http() {  # URL PID NAME: until URL answers 200, or the process died / 120 s passed
  local url=$1 pid=$2 name=$3
  for _ in $(seq 1200); do
    if http_ok "$url"; then return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "replicas.sh: $name exited; its log: $dir/$name.log" >&2; tail -5 "$dir/$name.log" >&2; return 1; }
    sleep 0.1
  done
  echo "replicas.sh: $name did not answer $url within 120 s" >&2
  return 1
}

up() {
  [ -x "$BIN" ] || { echo "replicas.sh: $BIN not built (scripts/build.sh release veloxquant)" >&2; exit 1; }
  "$PY" -c "import sglang_router" 2>/dev/null || { echo "replicas.sh: sglang-router missing in .venv (scripts/setup.sh)" >&2; exit 1; }
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || { echo "replicas.sh: -n $n must be in 1..64" >&2; exit 2; }
  if [ -f "$dir/router.pid" ] && kill -0 "$(cat "$dir/router.pid")" 2>/dev/null; then
    echo "replicas.sh: already running ($dir); scripts/replicas.sh down first" >&2; exit 1
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  trap 'echo "replicas.sh: start failed, stopping what started" >&2; down' ERR
  local cores
  cores=$(nproc)
  [ "$threads" -gt 0 ] || threads=$(( cores / n > 0 ? cores / n : 1 ))
  local store_flags=()
  if [ "$store" = 1 ]; then
    local rport=$((port + 100))
    redis-server --port "$rport" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
      --maxmemory 2gb --maxmemory-policy allkeys-lru >"$dir/redis.log" 2>&1 &
    echo $! >"$dir/redis.pid"
    for _ in $(seq 100); do
      if command -v redis-cli >/dev/null; then redis-cli -p "$rport" ping >/dev/null 2>&1 && break
      else (exec 3<>"/dev/tcp/127.0.0.1/$rport") 2>/dev/null && break; fi
      sleep 0.05
    done
    store_flags=(--prefix-store "redis://127.0.0.1:$rport")
  fi
  local urls=() i
  for ((i = 0; i < n; i++)); do
    local p=$((port + 1 + i)) pin=() ev=()
    if command -v taskset >/dev/null && taskset -c 0 true 2>/dev/null && [ $(( (i + 1) * threads )) -le "$cores" ]; then
      pin=(taskset -c "$((i * threads))-$(((i + 1) * threads - 1))")
    fi
    [ "$kv_events" = 1 ] && ev=(--kv-events "ipc://$dir/kv-$i.pub" --kv-events-replay "ipc://$dir/kv-$i.replay")
    "${pin[@]}" "$BIN" serve ${model:+-m "$model"} --port "$p" -t "$threads" --kv-cache "$kv_cache" \
      --kv-budget "$kv_budget" --parallel "$parallel" --session-dir "$dir" "${store_flags[@]}" "${ev[@]}" \
      "${extra[@]}" >"$dir/replica-$i.log" 2>&1 &
    echo $! >"$dir/replica-$i.pid"
    urls+=("http://127.0.0.1:$p")
  done
  for ((i = 0; i < n; i++)); do wait_http "${urls[$i]}/health" "$(cat "$dir/replica-$i.pid")" "replica-$i"; done
  "$PY" -m sglang_router.launch_router --host 127.0.0.1 --port "$port" --worker-urls "${urls[@]}" \
    --policy "$policy" --cb-failure-threshold 2 --cb-timeout-duration-secs 10 --health-check-interval-secs 5 \
    --log-level warn >"$dir/router.log" 2>&1 &
  echo $! >"$dir/router.pid"
  wait_http "http://127.0.0.1:$port/v1/models" "$(cat "$dir/router.pid")" router
  trap - ERR
  echo "replicas.sh: $n replicas (${threads} threads each, kv cache $kv_cache) behind sglang-router ($policy) on http://127.0.0.1:$port${store_flags:+, prefix store redis://127.0.0.1:$((port + 100))}"
}

status() {
  for f in "$dir"/*.pid; do
    [ -e "$f" ] || continue
    local name pid
    name=$(basename "$f" .pid) pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then echo "$name: running (pid $pid)"; else echo "$name: gone (pid $pid)"; fi
  done
}

case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/replicas.sh up|down|status [options] (see the header of $0)" >&2; exit 2 ;;
esac
