# Shared by the set-up scripts (sourced, not run). A long step says what it sets up, how long it
# usually takes and where its log is, writes its whole output to that log, and shows that it is
# alive:
#   step NAME EXPECTED LOG -- CMD [ARG...]
# CMD (a command or a shell function) runs in a subshell with `set -e`, stdout and stderr to LOG.
# One line at the start, one at the end with the elapsed time. On a terminal, unless CI=true, a
# heartbeat line every REGBENCH_HEARTBEAT seconds (default 30) with the log's last line. When CMD
# fails: the log's last lines, and the calling script exits with CMD's status.

fmt_secs() {
  if [ "$1" -ge 60 ]; then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi
}

# A step that has nothing to do: one line, so that a re-run still says what it checked.
ready() { printf '    ready: %s\n' "$*"; }

step() {
  local name=$1 expected=$2 log=$3
  shift 3
  [ "${1:-}" = "--" ] && shift
  mkdir -p "$(dirname "$log")"
  printf '==> %s: usually %s; log: %s\n' "$name" "$expected" "$log"
  local start=$SECONDS hb="" rc errexit=""
  if [ -t 1 ] && [ "${CI:-}" != true ]; then
    # Polls every second and ends by itself once this script is gone (an interrupted set-up
    # leaves no heartbeat behind).
    (
      every=${REGBENCH_HEARTBEAT:-30} parent=$$ t0=$(date +%s) next=$every
      while kill -0 "$parent" 2>/dev/null; do
        sleep 1
        el=$(($(date +%s) - t0))
        if [ "$el" -ge "$next" ]; then
          next=$((next + every))
          last=$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-70)
          printf '    ... %s elapsed (usually %s)%s\n' "$(fmt_secs "$el")" "$expected" "${last:+ | $last}"
        fi
      done
    ) &
    hb=$!
  fi
  case $- in *e*) errexit=1 ;; esac
  set +e # so that `set -e` holds inside the subshell (it would not under `if` or `||`)
  (
    set -e
    "$@"
  ) >"$log" 2>&1 </dev/null
  rc=$?
  [ -n "$errexit" ] && set -e
  if [ -n "$hb" ]; then
    kill "$hb" 2>/dev/null
    wait "$hb" 2>/dev/null || true
  fi
  local took
  took=$(fmt_secs $((SECONDS - start)))
  if [ "$rc" -ne 0 ]; then
    {
      printf '!!  %s FAILED after %s (exit %d). Last lines of %s:\n' "$name" "$took" "$rc" "$log"
      tail -n 30 "$log" | sed 's/^/    | /'
    } >&2
    exit "$rc"
  fi
  printf '    done in %s: %s\n' "$took" "$name"
}

# Side by side: a script whose work nothing before its `await` needs runs in the background (the
# pip installs, the image builds: on 2 cores they wait on the network and the disk more than on
# each other). Its lines are printed, in one piece, when it is awaited.
#   later ID CMD [ARG...]   starts CMD, its output to $LOG_DIR/ID.out
#   await ID                waits for it, prints its output; exits with its status if it failed
# A script that exits before awaiting stops what it started (the EXIT trap).
declare -A LATER_PID=()
later() {
  local id=$1
  shift
  mkdir -p "$LOG_DIR"
  "$@" >"$LOG_DIR/$id.out" 2>&1 </dev/null &
  LATER_PID[$id]=$!
  printf '==> %s: started beside the next steps; its lines come when it ends (%s)\n' "$id" "$LOG_DIR/$id.out"
  trap stop_later EXIT
}
stop_later() {
  local pid
  for pid in "${LATER_PID[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
  done
}
await() {
  local id=$1 rc=0 start=$SECONDS
  wait "${LATER_PID[$id]}" || rc=$?
  unset "LATER_PID[$id]"
  sed 's/^/    /' "$LOG_DIR/$id.out"
  if [ "$rc" -ne 0 ]; then
    printf '!!  %s FAILED (exit %d); its output is above\n' "$id" "$rc" >&2
    exit "$rc"
  fi
  printf '    %s ended (waited %s for it)\n' "$id" "$(fmt_secs $((SECONDS - start)))"
}
