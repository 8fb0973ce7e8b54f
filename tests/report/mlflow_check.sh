#!/usr/bin/env bash
# mlflow_check.sh SCRATCH VENV PROGRAM QUICKSTART MPIEXEC ARGS... (MPIEXEC ARGS...: how to launch 2
# ranks): starts a real MLflow tracking server from PyPI (pinned in requirements-mlflow.txt, in a
# venv made once; sqlite backend, on 127.0.0.1, stopped on exit), logs to it with
# cohort::report::mlflow (examples/quickstart --mlflow, then cohort_mlflow_program's sweep of 4
# trials, at 2 ranks) and reads everything back with MLflow's own client (mlflow_read.py). Then a
# run of cohort_mlflow_program during which the server is stopped and started again: training must
# end when it would have, and no metric be lost (the best and the latest checkpoint tagged).
# Where the venv cannot be made (no network), the test says why and exits 77 (skipped).
set -u
scratch=$1 venv=$2 program=$3 quickstart=$4
shift 4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() { echo "FAIL: $*"; exit 1; }

bash "$here/../make_venv.sh" "$venv" "$here/requirements-mlflow.txt" || exit $?

rm -rf "$scratch" && mkdir -p "$scratch"
port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
uri=http://127.0.0.1:$port
server_pid=""
# The server's job runner (GenAI scorers; nothing the tracking API uses) is off: it halves the
# start (17 -> 10 s on 2 idle cores), and the restart below must come back before the run's last
# sends give up (report::mlflow's end_timeout_s, 20 s) on a machine busy with builds beside.
start_server() {
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$venv/bin/mlflow" server --backend-store-uri "sqlite:///$scratch/mlflow.db" --default-artifact-root "$scratch/artifacts" \
    --host 127.0.0.1 --port "$port" --workers 1 >>"$scratch/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 240); do
    "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('$uri/health', timeout=1)" 2>/dev/null && return 0
    sleep 0.5
  done
  tail -20 "$scratch/server.log"
  fail "the MLflow server did not start within 120 s"
}
stop_server() { [ -n "$server_pid" ] && kill -TERM -- "-$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""; }
trap stop_server EXIT

run() {  # NAME ARGS...: the program at 2 ranks, its output in NAME.log
  local name=$1 rc
  shift
  timeout 300 "$@" >"$scratch/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { tail -20 "$scratch/$name.log"; fail "$name exited $rc"; }
}
seconds() { grep -o "\"$2\": [0-9.]*" "$scratch/$1.log" | awk '{print $2}'; }

start_server
run quickstart "$@" "$quickstart" --mlflow "$uri" --storage "$scratch/runs"
"$venv/bin/python" "$here/mlflow_read.py" "$uri" quickstart || exit 1
run sweep "$@" "$program" --uri "$uri" --mode sweep --name sweep --storage "$scratch/runs" --steps 12
"$venv/bin/python" "$here/mlflow_read.py" "$uri" sweep sweep 12 || exit 1

# The outage: 60 reports 250 ms apart; the server stopped after about 3 s and started again.
run steady "$@" "$program" --uri "$uri" --mode run --name steady --storage "$scratch/runs" --steps 60 --sleep-ms 250
timeout 300 "$@" "$program" --uri "$uri" --mode run --name outage --storage "$scratch/runs" --steps 60 --sleep-ms 250 \
  >"$scratch/outage.log" 2>&1 &
program_pid=$!
sleep 3
stop_server
start_server
wait $program_pid || { tail -20 "$scratch/outage.log"; fail "the run during the outage failed"; }
grep -q "does not answer" "$scratch/outage.log" || fail "the outage was not said (outage.log: $(tail -3 "$scratch/outage.log"))"
[ "$(grep -c "does not answer" "$scratch/outage.log")" -eq 1 ] || fail "the outage was said more than once"
"$venv/bin/python" "$here/mlflow_read.py" "$uri" run outage 60 || exit 1
steady_s=$(seconds steady trained_s) outage_s=$(seconds outage trained_s)
awk -v a="$steady_s" -v b="$outage_s" 'BEGIN { exit !(b < a * 1.1 + 1) }' ||
  fail "training took $outage_s s with the server away, $steady_s s without"
echo "ok: MLflow $("$venv/bin/python" -c 'import mlflow; print(mlflow.__version__)'): the quickstart, a sweep of 4 nested trials," \
  "and a run through a server restart (training $outage_s s against $steady_s s, every metric there)"
