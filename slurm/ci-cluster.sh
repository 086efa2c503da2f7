#!/usr/bin/env bash
# An emulated Slurm cluster on this one machine, for CI and local tests of the Slurm path.
#
#   bash slurm/ci-cluster.sh start   # munge + slurmctld + N slurmd (node1..nodeN), waits until all idle
#   bash slurm/ci-cluster.sh stop    # stops what start started
#   bash slurm/ci-cluster.sh env     # prints `export SLURM_CONF=...` for a shell
#
# Installs nothing: needs Debian's slurmctld, slurmd, slurm-client and munge (scripts/setup.sh installs
# them) and root. Every node is localhost with its own slurmd port; each advertises fake GPUs through
# GRES files that are links to /dev/null, so --gpus-per-node scheduling and CUDA_VISIBLE_DEVICES work
# without a GPU. No cgroups: processes are tracked by linuxproc, memory is not enforced.
# Settings (env): SLURM_CI_NODES (4), SLURM_CI_GPUS (4 per node), SLURM_CI_CPUS (2 per node),
# SLURM_CI_MEM (MiB per node, 4000), SLURM_CI_DIR (state; default <repo>/.slurm-cluster, gitignored).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${SLURM_CI_NODES:-4}
GPUS=${SLURM_CI_GPUS:-4}
CPUS=${SLURM_CI_CPUS:-2}
MEM=${SLURM_CI_MEM:-4000}
R=${SLURM_CI_DIR:-$ROOT/.slurm-cluster}
CTLD_PORT=${SLURM_CI_CTLD_PORT:-6837}
SLURMD_BASE_PORT=${SLURM_CI_SLURMD_PORT:-17100}
export SLURM_CONF=$R/slurm.conf

write_config() {
  mkdir -p "$R"/{state,spool,log,fakegpu}
  for ((g = 0; g < GPUS; g++)); do ln -sfn /dev/null "$R/fakegpu/nvidia$g"; done
  cat > "$R/slurm.conf" <<CONF
# Written by slurm/ci-cluster.sh: an emulated ${N}-node cluster on one host.
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$R/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default memory per CPU every job asks for the whole node and jobs run one at a time.
DefMemPerCPU=500
SchedulerType=sched/backfill
# Jobs start about 1 s after submit instead of waiting for the next scheduling pass.
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
# Slurm's default: the seconds a cancelled job's processes have between SIGTERM and SIGKILL, in which a sweep
# marks its running trials interrupted (5 s was too short on a loaded 2-core machine: the trial was left RUNNING)
KillWait=30
GresTypes=gpu
SlurmctldPort=$CTLD_PORT
SlurmctldPidFile=$R/slurmctld.pid
SlurmdPidFile=$R/slurmd-%n.pid
SlurmdSpoolDir=$R/spool/%n
StateSaveLocation=$R/state
SlurmctldLogFile=$R/log/slurmctld.log
SlurmdLogFile=$R/log/slurmd-%n.log
NodeName=node[1-$N] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((SLURMD_BASE_PORT + 1))-$((SLURMD_BASE_PORT + N))] CPUs=$CPUS RealMemory=$MEM Gres=gpu:h100:$GPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  cat > "$R/gres.conf" <<CONF
AutoDetect=off
NodeName=node[1-$N] Name=gpu Type=h100 File=$R/fakegpu/nvidia[0-$((GPUS - 1))]
CONF
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

idle_nodes() { sinfo -h -t idle -o %D 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
# nodes that answer: idle, or running or finishing a job (a test's job may still be ending when the next starts)
up_nodes() { sinfo -h -t idle,alloc,mix,comp -o %D 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

start() {
  if [ "$(id -u)" != 0 ]; then echo "error: ci-cluster.sh start needs root (slurmd runs as root)" >&2; exit 2; fi
  for bin in slurmctld slurmd sinfo munged; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] ||
      { echo "error: $bin not found; install slurmctld slurmd slurm-client munge (scripts/setup.sh)" >&2; exit 2; }
  done
  local t0; t0=$(date +%s.%N)
  write_config
  mkdir -p /run/munge && chown munge:munge /run/munge
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
  alive "$R/slurmctld.pid" || slurmctld
  for ((i = 1; i <= N; i++)); do
    alive "$R/slurmd-node$i.pid" || slurmd -N "node$i"
  done
  # A node left down by an earlier run (e.g. killed slurmd) comes back here; a node busy with a job that is still
  # running or ending (started again while a test's job winds down) is up.
  for _ in $(seq 1 300); do
    [ "$(up_nodes)" -ge "$N" ] && break
    scontrol update nodename="node[1-$N]" state=resume >/dev/null 2>&1 || true
    sleep 0.1
  done
  if [ "$(up_nodes)" -lt "$N" ]; then
    echo "error: only $(up_nodes)/$N nodes up after 30 s; see $R/log/" >&2
    sinfo -N -o '%N %T %G' >&2 || true
    exit 1
  fi
  echo "slurm: $N nodes up in $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $t0}") s (SLURM_CONF=$SLURM_CONF)"
}

stop() {
  [ -f "$R/slurm.conf" ] || return 0
  scancel --full --quiet --user=root 2>/dev/null || true
  for pidfile in "$R"/slurmd-*.pid "$R/slurmctld.pid"; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$pidfile"
  done
  echo "slurm: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
