#!/usr/bin/env bash
# Stop the test cluster that tests/slurm/start_cluster.sh started, each daemon by the PID it wrote.
set -uo pipefail
DIR=${ANDREA_SLURM_DIR:-/tmp/andrea-slurm}
for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/slurmdbd.pid" "$DIR/mysql/mariadb.pid" /run/munge/munged.pid; do
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        pid=$(cat "$pidfile")
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
done
