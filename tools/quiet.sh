# Sourced by tools/install.sh and the test scripts: one line per step, the
# tools' own output (apt, dpkg, pip, CMake) in build/logs/<name>.log, printed
# only when the step fails.
TK_LOG_DIR=${TK_LOG_DIR:-build/logs}

# Each step line starts with the time since its script started, so a log
# shows how long each part took (docs/testing.md).
step() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# quietly NAME CMD...: runs CMD, its output in $TK_LOG_DIR/NAME.log.
quietly() {
  local name=$1 log rc
  shift
  mkdir -p "$TK_LOG_DIR"
  log="$TK_LOG_DIR/$name.log"
  if "$@" >"$log" 2>&1; then rc=0; else rc=$?; fi
  if [ "$rc" -ne 0 ]; then
    echo "failed ($rc): $* -- the end of $log:" >&2
    tail -n 40 "$log" >&2
  fi
  return "$rc"
}

# with_progress NAME CMD...: like quietly, and shows Ninja's progress lines
# ("[done/total] file") as they come, so a long C++ build is seen moving.
with_progress() {
  local name=$1 log rc
  shift
  mkdir -p "$TK_LOG_DIR"
  log="$TK_LOG_DIR/$name.log"
  { if "$@" 2>&1; then rc=0; else rc=$?; fi; echo "$rc" >"$log.rc"; } | tee "$log" | {
    grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\] ' |
      sed -u -E 's#^ *(\[[0-9]+/[0-9]+\]) Building [A-Z]+ object ([^ ]*\.dir/)?(.*)\.o$#  \1 \3#;
                 s#^ *(\[[0-9]+/[0-9]+\]) Linking [A-Z]+ [a-z]+ [a-z]+ (.*)$#  \1 linking \2#' || true
  }
  rc=$(cat "$log.rc")
  rm -f "$log.rc"
  if [ "$rc" -ne 0 ]; then
    echo "failed ($rc): $* -- the end of $log:" >&2
    tail -n 60 "$log" >&2
  fi
  return "$rc"
}
