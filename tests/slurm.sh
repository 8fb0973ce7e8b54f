#!/usr/bin/env bash
# slurm.sh SOURCE_DIR SCRATCH QUICKSTART FAULT_PROGRAM FASHION_MNIST
# A one-node Slurm made here (Debian's slurm-wlm: slurmctld and slurmd, and munged for its
# authentication, with their config, state and logs in SCRATCH, munged's key and socket in a
# directory of its own; on ports nothing listens on; all stopped on exit), then:
#   - `srun --mpi=pmix -n 2` the quickstart: it trains on the 2 ranks Slurm started;
#   - `srun --mpi=pmix -n 3` the fault program: each rank's node and local rank as Slurm placed it;
#   - examples/slurm.sbatch with `sbatch --wait` on one node, 2 tasks: the Fashion-MNIST example.
# Exits 77 (ctest: Skipped) with the reason when Slurm cannot start here (not root, not installed).
set -u
src=$1 scratch=$2 quickstart=$3 prog=$4 fashion=$5
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIPPED: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "a test Slurm runs its daemons as root here"
for c in slurmctld slurmd srun sbatch munged; do
  command -v $c >/dev/null || skip "$c is not installed (apt-get install slurm-wlm munge; scripts/test does)"
done
rm -rf "$scratch" && mkdir -p "$scratch"/{state,spool,runs}
# munged refuses a key, socket or log whose directory, or any directory above it, others may write
# without the sticky bit: its files live in a directory of its own under /tmp, not in the build tree.
munge=$(mktemp -d /tmp/cohort-test-munge.XXXXXX) && chmod 755 "$munge" || skip "mktemp -d under /tmp failed"
pids=()  # the daemons, run in the foreground of this script's children
cleanup() {
  # Jobs left by a step that timed out run under slurmstepd, not under this script: cancel them.
  local jobs
  jobs=$(squeue -h -o %i 2>/dev/null)
  [ -z "$jobs" ] || { scancel $jobs 2>/dev/null; sleep 2; }
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  cp "$munge/munged.log" "$scratch/" 2>/dev/null
  rm -rf "$munge"
  true
}
trap cleanup EXIT
# ready NAME LOG CHECK...: for the daemon just started ($!, stopped on exit), waits up to 30 s until
# the command CHECK succeeds, and skips with the tail of its LOG when it has exited first (or CHECK
# never succeeds).
ready() {
  local name=$1 log=$2 pid=$!
  pids+=("$pid")
  shift 2
  for _ in $(seq 1 60); do
    "$@" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || skip "$name does not start here: $(tail -3 "$log" 2>/dev/null | tr '\n' ' ')"
    sleep 0.5
  done
  skip "$name did not get ready in 30 s: $(tail -3 "$log" 2>/dev/null | tr '\n' ' ')"
}
# free_port: a TCP port below Linux's ephemeral range (where MPI jobs beside this test listen) that
# nothing listens on, with the next one free too.
free_port() {
  local p used
  used=$(ss -Htln 2>/dev/null | awk '{n = split($4, a, ":"); print a[n]}')
  for p in $(shuf -i 20000-32000 -n 200); do
    grep -qx "$p" <<<"$used" || grep -qx "$((p + 1))" <<<"$used" || { echo "$p"; return; }
  done
  echo $((20000 + $$ % 12000))
}

# munged with a key of its own, on a socket of its own.
dd if=/dev/urandom of="$munge/munge.key" bs=1024 count=1 status=none && chmod 400 "$munge/munge.key"
munged --foreground --socket="$munge/munge.sock" --key-file="$munge/munge.key" --pid-file="$munge/munged.pid" \
  --log-file="$munge/munged.log" --seed-file="$munge/munge.seed" >>"$munge/munged.log" 2>&1 &
ready munged "$munge/munged.log" test -S "$munge/munge.sock"

host=$(hostname) port=$(free_port)  # the controller matches its host by the short name
export SLURM_CONF=$scratch/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=cohorttest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge/munge.sock
CredType=cred/munge
StateSaveLocation=$scratch/state
SlurmdSpoolDir=$scratch/spool
SlurmctldPidFile=$scratch/slurmctld.pid
SlurmdPidFile=$scratch/slurmd.pid
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmctldLogFile=$scratch/slurmctld.log
SlurmdLogFile=$scratch/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
slurmctld -D -f "$SLURM_CONF" >>"$scratch/slurmctld.log" 2>&1 &
ready slurmctld "$scratch/slurmctld.log" bash -c 'scontrol ping | grep -q UP'
slurmd -D -N "$host" -f "$SLURM_CONF" >>"$scratch/slurmd.log" 2>&1 &
ready slurmd "$scratch/slurmd.log" bash -c 'sinfo -h -o %T | grep -q idle'

out=$(timeout 120 srun --mpi=pmix -n 2 "$quickstart" --storage "$scratch/runs" 2>&1)
rc=$?
printf '%s\n' "$out" | tail -2
[ $rc -eq 0 ] || fail "the quickstart under srun -n 2 failed (exit $rc)"
grep -q '^weight on each rank: \[[^,]*,[^,]*\]$' <<<"$out" || fail "the quickstart did not train on 2 ranks"

out=$(timeout 120 srun --mpi=pmix -n 3 --overcommit "$prog" --storage "$scratch/runs" --name placement 2>&1)
rc=$?
[ $rc -eq 0 ] || { printf '%s\n' "$out" | tail; fail "the fault program under srun -n 3 failed (exit $rc)"; }
for r in 0 1 2; do
  want="topology world_rank=$r world_size=3 node_rank=0 num_nodes=1 local_rank=$r local_world_size=3 host=$host"
  grep -qx "$want" <<<"$out" || { grep topology <<<"$out"; fail "rank $r: expected '$want'"; }
done

out=$(cd "$scratch" && COHORT_BIN=$fashion COHORT_STORAGE=$scratch/runs timeout 300 sbatch --wait --nodes=1 --ntasks-per-node=2 \
        --output="$scratch/sbatch.out" "$src/examples/slurm.sbatch" --epochs 1 --max-train 1024 2>&1)
rc=$?
tail -2 "$scratch/sbatch.out" 2>/dev/null
[ $rc -eq 0 ] || fail "examples/slurm.sbatch failed (exit $rc): $out"
grep -q '"test_accuracy":' "$scratch/sbatch.out" || fail "examples/slurm.sbatch did not train"
[ -d "$scratch/runs/cohort-fashion/checkpoint_000001" ] || fail "examples/slurm.sbatch did not name the run after the job"
echo "ok: slurm srun -n 2 (quickstart), srun -n 3 (placement), sbatch (examples/slurm.sbatch) on a one-node Slurm"
