#!/usr/bin/env bash
# A real Slurm on this machine, for the tests: munge, slurmctld and two slurmd nodes, n1 with two
# fake GPUs (two jobs on one node, each with its own) and n2 with one, everything under one scratch
# folder, ports free on 127.0.0.1.
#   scripts/slurm.sh install    installs slurm-wlm and munge when missing (scripts/setup.sh runs it)
#   scripts/slurm.sh up DIR     installs slurm-wlm and munge when missing (apt, as configured
#                               here), writes DIR/slurm.conf and DIR/gres.conf, starts the daemons,
#                               waits until both nodes are idle; prints the SLURM_CONF to export
#   scripts/slurm.sh down DIR   scontrol shutdown, then stops what `up` started, by pid
# Needs root (apt-get, mknod, the daemons). The fake GPUs are character devices made with mknod
# (Slurm refuses regular files) with NVIDIA's major number: Slurm hands them out as on a real
# cluster (CUDA_VISIBLE_DEVICES per job); nothing opens them. Logs: DIR/log/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"
cmd=${1:?usage: slurm.sh install | up DIR | down DIR}
[ "$cmd" = install ] || DIR=$(realpath -m "${2:?usage: slurm.sh up|down DIR}")

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

install_packages() {
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge
}

install() {
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    step "Debian packages slurm-wlm munge (a real Slurm for the executor's tests)" "~1 min" \
      "$ROOT/.cache/setup/slurm-apt.log" -- install_packages
  else
    ready "slurm-wlm and munge"
  fi
}

up() {
  install
  mkdir -p "$DIR"/{state,spool,log,run,dev}
  host=$(hostname -s)
  ctl=$(free_port) n1=$(free_port) n2=$(free_port)
  # Fake GPUs: nvidia0-1 on n1, nvidia2 on n2 (NVIDIA's character-device major is 195).
  for i in 0 1 2; do [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"; done
  cat > "$DIR/slurm.conf" <<EOF
ClusterName=regbench
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
SlurmctldPort=$ctl
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
GresTypes=gpu
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=10
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n1 CPUs=2 RealMemory=8000 Gres=gpu:2 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n2 CPUs=2 RealMemory=8000 Gres=gpu:1 State=UNKNOWN
PartitionName=regbench Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  cat > "$DIR/gres.conf" <<EOF
NodeName=n1 Name=gpu File=$DIR/dev/nvidia[0-1]
NodeName=n2 Name=gpu File=$DIR/dev/nvidia2
EOF
  export SLURM_CONF=$DIR/slurm.conf
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge /run/munge
    [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || /usr/sbin/create-munge-key -f; }
    rm -f /run/munge/munged.pid  # a killed daemon's, stale
    su -s /bin/sh munge -c munged
    # The daemon's own pid file (it forks twice: a pgrep right after can catch a parent on its
    # way out, and `down` then missed the daemon, which outlived the tests).
    for _ in $(seq 1 40); do [ -s /run/munge/munged.pid ] && break; sleep 0.25; done
    [ -s /run/munge/munged.pid ] || { echo "slurm.sh: munged wrote no pid file" >&2; exit 1; }
    cp /run/munge/munged.pid "$DIR/run/munged.pid"
  fi
  # Detached with no inherited stdio: they must never hold a test's or CI's output open.
  setsid slurmctld -f "$SLURM_CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1
  for n in n1 n2; do setsid slurmd -f "$SLURM_CONF" -N "$n" </dev/null >>"$DIR/log/slurmd-$n.out" 2>&1; done
  for _ in $(seq 1 120); do
    [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" = 2 ] && break
    sleep 0.5
  done
  if [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" != 2 ]; then
    sinfo -N 2>&1 || true
    tail -n 20 "$DIR"/log/*.log >&2 || true
    echo "slurm.sh: the nodes did not come up" >&2
    exit 1
  fi
  echo "SLURM_CONF=$SLURM_CONF"
}

down() {
  export SLURM_CONF=$DIR/slurm.conf
  [ -f "$SLURM_CONF" ] && scontrol shutdown >/dev/null 2>&1 || true
  for f in "$DIR"/run/slurmctld.pid "$DIR"/run/slurmd-*.pid "$DIR"/run/munged.pid; do
    [ -f "$f" ] || continue
    for pid in $(cat "$f"); do
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; kill "$pid" 2>/dev/null || true; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
    done
    rm -f "$f"
  done
}

case $cmd in
  install) install ;;
  up) up ;;
  down) down ;;
  *) echo "usage: slurm.sh up|down DIR" >&2; exit 2 ;;
esac
