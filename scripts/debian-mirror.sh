#!/usr/bin/env bash
# Prints the Debian mirror to debootstrap bookworm from: REGBENCH_DEBIAN_MIRROR when set, else the
# first one this machine's apt is configured with for bookworm itself (not -security, -updates or
# -backports), in apt's own reading order:
#   etc/apt/sources.list, then etc/apt/sources.list.d/* in name order: *.list files (classic
#   one-line `deb [options] URI SUITE COMPONENTS...`) and *.sources files (deb822 stanzas:
#   Types: deb, Suites: naming bookworm, the first of their URIs:; `Enabled: no` skips a stanza).
#   Files with any other name (e.g. *.disabled, *.save) are ignored, as apt ignores them.
# Usage: scripts/debian-mirror.sh [ROOT]   ROOT holds etc/apt (default /; tests pass a fake one).
# Exits 1, naming REGBENCH_DEBIAN_MIRROR, when none is found.
set -euo pipefail
SUITE=${REGBENCH_DEBIAN_SUITE:-bookworm}

if [ -n "${REGBENCH_DEBIAN_MIRROR:-}" ]; then
  printf '%s\n' "$REGBENCH_DEBIAN_MIRROR"
  exit 0
fi
apt_dir=${1:-/}
apt_dir=${apt_dir%/}/etc/apt

from_list() { # classic one-line format
  awk -v suite="$SUITE" '
    { sub(/#.*/, "") }
    $1 != "deb" { next }
    {
      line = $0
      sub(/^[ \t]*deb[ \t]+/, "", line)
      if (substr(line, 1, 1) == "[") { sub(/^\[[^\]]*\][ \t]*/, "", line) }
      n = split(line, f, /[ \t]+/)
      if (n >= 2 && f[1] !~ /^cdrom:/ && f[2] == suite) { print f[1]; exit }
    }' "$1"
}

from_sources() { # deb822 stanzas
  awk -v suite="$SUITE" '
    function has(list, word,   n, w, i) {
      n = split(list, w, /[ \t]+/)
      for (i = 1; i <= n; i++) if (w[i] == word) return 1
      return 0
    }
    function flush(   u) {
      if (!done && uris != "" && has(types, "deb") && has(suites, suite) && tolower(enabled) !~ /^[ \t]*no/) {
        split(uris, u, /[ \t]+/)
        print u[1]
        done = 1
      }
      types = ""; suites = ""; uris = ""; enabled = ""; key = ""
    }
    /^#/ { next }
    /^[ \t]*$/ { flush(); next }
    /^[ \t]/ {  # a continuation line of the field before
      if (key == "types") types = types " " $0
      else if (key == "suites") suites = suites " " $0
      else if (key == "uris") uris = uris " " $0
      next
    }
    {
      i = index($0, ":")
      if (!i) next
      key = tolower(substr($0, 1, i - 1))
      val = substr($0, i + 1)
      sub(/^[ \t]+/, "", val)
      if (key == "types") types = val
      else if (key == "suites") suites = val
      else if (key == "uris") uris = val
      else if (key == "enabled") enabled = val
    }
    END { flush() }' "$1"
}

files=()
[ -f "$apt_dir/sources.list" ] && files+=("$apt_dir/sources.list")
for f in "$apt_dir"/sources.list.d/*; do
  case $f in *.list | *.sources) [ -f "$f" ] && files+=("$f") ;; esac
done
for f in ${files[@]+"${files[@]}"}; do
  case $f in
    *.sources) mirror=$(from_sources "$f") ;;
    *) mirror=$(from_list "$f") ;;
  esac
  if [ -n "$mirror" ]; then
    printf '%s\n' "$mirror"
    exit 0
  fi
done

cat >&2 <<EOF
No Debian mirror for $SUITE found in $apt_dir/sources.list or $apt_dir/sources.list.d/*.list,*.sources
(the apt sources of this machine). Set REGBENCH_DEBIAN_MIRROR to the URL of a Debian mirror that
serves $SUITE (or pass --debian-mirror URL to scripts/setup-docker.sh).
EOF
exit 1
