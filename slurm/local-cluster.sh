#!/usr/bin/env bash
# A real single-node Slurm on localhost, for tests and for trying the batch scripts by hand.
#
#   slurm/local-cluster.sh start  DIR   # write DIR/slurm.conf, start munged, slurmctld, slurmd
#   slurm/local-cluster.sh status DIR   # which daemons run, and what sinfo says
#   slurm/local-cluster.sh stop   DIR   # cancel leftover jobs, stop the three daemons
#
# Then point the client commands at it:  export SLURM_CONF=DIR/slurm.conf; sbatch ...
#
# Needs root and Debian's packages (Slurm 22.05 on Debian 12):
#   apt-get install -y --no-install-recommends slurmd slurmctld slurm-client munge
# No systemd and no cgroups: the daemons are started by hand, processes are tracked through
# /proc (proctrack/linuxproc, task/none). Every file lives under DIR (config, munge key and
# socket, state, spool, pid and log files); the node is "localhost" (127.0.0.1) whatever the
# machine's hostname, and the ports are off Slurm's defaults (6817/6818), so the test cluster
# cannot clash with a real installation. It advertises LOCAL_SLURM_CPUS (default 4) CPUs
# whatever the machine has (SlurmdParameters=config_overrides), so 4 ranks fit on 2 cores.
#
# "stop" ends exactly the processes "start" started: the pids in DIR's pid files, and only
# when their command line still names DIR. It deletes nothing but those pid files; DIR and
# the logs stay (remove DIR yourself when done).
#
# Beyond that recipe (docs/slurm.md): a requeued job may start again after 5 s instead of 120
# (AuthInfo cred_expire), pending jobs are tried every 2 s instead of 60 (sched_interval), and
# every daemon and srun binds to 127.0.0.1 only (CommunicationParameters).
#
# Environment:
#   LOCAL_SLURM_CTLD_PORT    slurmctld's port (16817)
#   LOCAL_SLURM_D_PORT       slurmd's port (16818)
#   LOCAL_SLURM_CPUS         CPUs the node advertises (4)
#   LOCAL_SLURM_GPUS         FAKE GPUs the node advertises (0): GRES gpu backed by character
#                            devices DIR/fake-gpus/nvidiaK (with /dev/null's numbers), so jobs get
#                            CUDA_VISIBLE_DEVICES as on a GPU node and the GPU scripts' binding can
#                            be checked without GPUs (mpidist itself finds no GPU there)
#   LOCAL_SLURM_CRED_EXPIRE  seconds before a requeued job may start again (5, Slurm's least)
#   LOCAL_SLURM_TIMEOUT      seconds to wait for each daemon to start or stop (30)
set -euo pipefail

CTLD_PORT="${LOCAL_SLURM_CTLD_PORT:-16817}"
D_PORT="${LOCAL_SLURM_D_PORT:-16818}"
CPUS="${LOCAL_SLURM_CPUS:-4}"
TIMEOUT="${LOCAL_SLURM_TIMEOUT:-30}"
CRED_EXPIRE="${LOCAL_SLURM_CRED_EXPIRE:-5}"
GPUS="${LOCAL_SLURM_GPUS:-0}"
NODE=localhost

usage() {
    echo "usage: $0 start|stop|status DIR" >&2
    exit 2
}

[[ $# -eq 2 ]] || usage
ACTION="$1"
mkdir_if_start() { if [[ "$ACTION" == start ]]; then mkdir -p "$1"; fi; }
mkdir_if_start "$2"
[[ -d "$2" ]] || { echo "$0: $2 is not a directory" >&2; exit 2; }
DIR="$(cd "$2" && pwd -P)"
export SLURM_CONF="$DIR/slurm.conf"

MUNGE_DIR="$DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
MUNGE_PID="$MUNGE_DIR/munged.pid"
CTLD_PID="$DIR/slurmctld.pid"
D_PID="$DIR/slurmd.pid"

log() { echo "local-cluster: $*" >&2; }

need() {
    local missing=()
    for cmd in munged slurmctld slurmd scontrol sinfo squeue scancel; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    if ((${#missing[@]})); then
        log "missing ${missing[*]}: apt-get install -y --no-install-recommends slurmd slurmctld slurm-client munge"
        exit 3
    fi
}

# The pid in file $1 if that process is alive and its command line names DIR (so a recycled
# pid, or a daemon of another cluster, is never touched); else nothing.
our_pid() {
    local file="$1" pid
    [[ -s "$file" ]] || return 0
    pid="$(tr -dc '0-9' <"$file")"
    [[ -n "$pid" ]] && running "$pid" || return 0
    if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$DIR/"; then
        echo "$pid"
    fi
}

running() {  # running PID: alive and not a zombie (an exited daemon waiting for init to reap it)
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ -n "$stat" && "${stat%% *}" != Z ]]
}

wait_for() {  # wait_for DESCRIPTION COMMAND...: poll COMMAND until it succeeds or TIMEOUT
    local what="$1" deadline=$((SECONDS + TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${TIMEOUT}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

node_idle() { [[ "$(sinfo -h -n "$NODE" -o %t 2>/dev/null)" == idle ]]; }
munge_up() { [[ -S "$MUNGE_SOCKET" && -n "$(our_pid "$MUNGE_PID")" ]]; }

write_config() {
    mkdir -p "$DIR/state" "$DIR/spool" "$MUNGE_DIR"
    chmod 700 "$MUNGE_DIR"
    if [[ ! -s "$MUNGE_DIR/munge.key" ]]; then
        (umask 077 && dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none)
    fi
    chmod 600 "$MUNGE_DIR/munge.key"
    : >"$DIR/plugstack.conf"  # no SPANK plugins (not /etc/slurm's)
    local gres=""
    if ((GPUS > 0)); then
        mkdir -p "$DIR/fake-gpus"
        for ((k = 0; k < GPUS; k++)); do
            [[ -c "$DIR/fake-gpus/nvidia$k" ]] || mknod "$DIR/fake-gpus/nvidia$k" c 1 3
        done
        echo "NodeName=$NODE Name=gpu File=$DIR/fake-gpus/nvidia[0-$((GPUS - 1))]" >"$DIR/gres.conf"
        gres=" Gres=gpu:$GPUS"
    else
        : >"$DIR/gres.conf"
    fi
    cat >"$SLURM_CONF" <<EOF
# Written by slurm/local-cluster.sh: a single-node test cluster under $DIR
ClusterName=mpidist-local
SlurmctldHost=$NODE
SlurmctldPort=$CTLD_PORT
SlurmdPort=$D_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job may start again only this many seconds later (Slurm's default, 120 s,
# would stall the requeue test).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=$CRED_EXPIRE
# Bind to the address the names resolve to (localhost: 127.0.0.1), not to every interface.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$D_PID
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=pmi2
ReturnToService=2
MailProg=/bin/true
KillWait=5
# Try pending jobs every 2 s (default 60 s): a requeued job, or one submitted while the node
# was still cleaning up after the previous one, starts within seconds.
SchedulerParameters=sched_interval=2
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$CPUS State=UNKNOWN$gres
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

show_logs() {
    for f in "$MUNGE_DIR/munged.log" "$DIR/slurmctld.log" "$DIR/slurmd.log"; do
        [[ -f "$f" ]] && { log "--- last lines of $f"; tail -n 15 "$f" >&2; }
    done
    return 0
}

start() {
    need
    if [[ "$(id -u)" != 0 ]]; then
        log "must run as root (SlurmUser=root, slurmd runs jobs as their users)"
        exit 3
    fi
    if [[ -n "$(our_pid "$MUNGE_PID")$(our_pid "$CTLD_PID")$(our_pid "$D_PID")" ]]; then
        log "a cluster is already running under $DIR (stop it first)"
        exit 1
    fi
    write_config
    # -f: run although the key and socket are outside /etc/munge and /run/munge.
    munged -f --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$MUNGE_PID" --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed"
    wait_for "munged" munge_up || { show_logs; stop; exit 1; }
    # -c: a clean start (no jobs or node state from an earlier run of this DIR).
    slurmctld -c -f "$SLURM_CONF"
    wait_for "slurmctld (scontrol ping)" scontrol ping || { show_logs; stop; exit 1; }
    slurmd -N "$NODE" -f "$SLURM_CONF"
    wait_for "node $NODE idle (sinfo)" node_idle || { show_logs; stop; exit 1; }
    log "running: SLURM_CONF=$SLURM_CONF (slurmctld port $CTLD_PORT, slurmd port $D_PORT, $CPUS CPUs)"
}

stop_daemon() {  # stop_daemon NAME PIDFILE: TERM, up to TIMEOUT seconds, then KILL
    local name="$1" file="$2" pid deadline
    pid="$(our_pid "$file")"
    if [[ -z "$pid" ]]; then
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + TIMEOUT))
    while running "$pid" && ((SECONDS < deadline)); do sleep 0.05; done
    if running "$pid"; then
        log "$name ($pid) ignored SIGTERM for ${TIMEOUT}s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$file"
}

stop() {
    if [[ -n "$(our_pid "$CTLD_PID")" ]] && command -v scancel >/dev/null; then
        # Cancel what is left, and give the steps KillWait to end before slurmd goes.
        local jobs deadline=$((SECONDS + TIMEOUT))
        jobs="$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
        if [[ -n "${jobs// /}" ]]; then
            log "cancelling leftover jobs: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            while [[ -n "$(squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < deadline)); do
                sleep 0.2
            done
        fi
    fi
    stop_daemon slurmd "$D_PID"
    stop_daemon slurmctld "$CTLD_PID"
    stop_daemon munged "$MUNGE_PID"
}

status() {
    local rc=0 pid
    for entry in "munged:$MUNGE_PID" "slurmctld:$CTLD_PID" "slurmd:$D_PID"; do
        pid="$(our_pid "${entry#*:}")"
        if [[ -n "$pid" ]]; then
            echo "${entry%%:*}: running (pid $pid)"
        else
            echo "${entry%%:*}: not running"
            rc=1
        fi
    done
    if ((rc == 0)); then
        echo "SLURM_CONF=$SLURM_CONF"
        sinfo -N -o "%N %t %c" 2>/dev/null || rc=1
    fi
    return "$rc"
}

case "$ACTION" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) usage ;;
esac
