#!/usr/bin/env bash
# A throwaway single-node SLURM cluster for the tests: a controller (slurmctld) and one node
# daemon (slurmd) on localhost, with a MUNGE daemon of their own, everything (configuration,
# key, sockets, state, logs) in one folder. Nothing of the system's own SLURM or MUNGE set-up
# is read or touched.
#
#   bash scripts/slurm-test-cluster.sh start DIR   # prints the path of slurm.conf on stdout
#   bash scripts/slurm-test-cluster.sh stop DIR
#
# Clients find the cluster by `SLURM_CONF=DIR/slurm.conf` (the tests read it from
# TENSORTUNE_TEST_SLURM_CONF). Needs Debian's `slurm-wlm` and `munge` packages, and root: the
# node daemon starts every job as its submitting user. The node has the machine's CPUs and no
# cgroups (process tracking by /proc), which is what a container allows.
set -euo pipefail
cmd="${1:-}"
dir="${2:-}"
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

stop_pid_file() {
  local f="$1"
  [ -f "$f" ] || return 0
  local pid
  pid="$(cat "$f")"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

case "$cmd" in
  start)
    for tool in slurmctld slurmd munged mungekey sinfo; do
      if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
        echo "slurm-test-cluster: $tool not found (apt-get install -y slurm-wlm munge)" >&2
        exit 1
      fi
    done
    if [ "$(id -u)" -ne 0 ]; then
      echo "slurm-test-cluster: needs root (slurmd starts jobs as their user)" >&2
      exit 1
    fi
    export PATH="$PATH:/usr/sbin"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    # The munge user must pass through it (mktemp -d makes it 0700).
    chmod 0711 "$dir"
    # MUNGE insists on a folder owned by the user it runs as, which every user may pass
    # through (slurmd and the job steps reach the socket) but nobody else may write.
    install -d -m 0711 -o munge -g munge "$dir/munge"
    # From /: the caller's folder may be closed to the munge user.
    cd /
    runuser -u munge -- mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null 2>&1
    runuser -u munge -- munged --socket="$dir/munge/munge.socket" \
      --key-file="$dir/munge/munge.key" --pid-file="$dir/munge/munged.pid" \
      --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    mkdir -p "$dir/state" "$dir/spool"
    host="$(hostname -s)"
    cpus="$(nproc)"
    cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-test-cluster.sh: a single-node test cluster on localhost.
ClusterName=tensortune-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    # Up when the node answers idle (or mixed, should a job already run).
    for _ in $(seq 100); do
      state="$(sinfo -h -N -o '%T' 2>/dev/null | head -n1 || true)"
      case "$state" in
        idle* | mixed* | allocated*)
          echo "$SLURM_CONF"
          exit 0
          ;;
      esac
      sleep 0.3
    done
    echo "slurm-test-cluster: the node did not come up (state '${state:-none}'); logs in $dir" >&2
    exit 1
    ;;
  stop)
    stop_pid_file "$dir/slurmd.pid"
    stop_pid_file "$dir/slurmctld.pid"
    stop_pid_file "$dir/munge/munged.pid"
    ;;
  *)
    echo "slurm-test-cluster: unknown command '$cmd' (expected start or stop)" >&2
    exit 2
    ;;
esac
