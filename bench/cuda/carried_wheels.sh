# Sourced by the device run scripts (run_torch_bench.sh, run_replicas16.sh): the device machine has
# no package registry, so wheels fetched on the project machine (pip download --no-deps) travel with
# the tree. install_missing_wheels TARGET WHEEL...: each wheel whose top module Python cannot import
# (with TARGET on its path) is installed into TARGET, the others are left to the machine's own.
install_missing_wheels() {
  local target=$1 w mod
  shift
  for w in "$@"; do
    [ -f "$w" ] || continue
    mod=$(basename "$w" | cut -d- -f1)
    PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH} python3 -c "import $mod" 2> /dev/null ||
      python3 -m pip install -q --no-deps --no-index --target "$target" "$w"
  done
}
