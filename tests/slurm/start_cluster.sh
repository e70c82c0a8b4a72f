#!/usr/bin/env bash
# Stand up a single-node SLURM cluster with accounting on this machine, for the tests marked `slurm`:
# munged, MariaDB, slurmdbd, slurmctld and slurmd, from Debian's packages (slurm-wlm, munge, slurmdbd,
# mariadb-server), as root, without systemd. Idempotent: a cluster already up is left as it is (well under a
# second). The daemons' files, logs and PIDs are in $ANDREA_SLURM_DIR (default /tmp/andrea-slurm);
# tests/slurm/stop_cluster.sh stops them by PID. Exits non-zero with one line on stderr when it cannot.
#   tests/slurm/start_cluster.sh [--install]   # --install: apt-get the packages first when they are missing
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DIR=${ANDREA_SLURM_DIR:-/tmp/andrea-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# andrea-exp test cluster"
fail() { echo "slurm test cluster: $*" >&2; exit 1; }

up() { # the controller answers and the node takes jobs
    timeout 5 scontrol ping 2>/dev/null | grep -q UP &&
        timeout 5 sinfo -h -N -o %T 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'
}
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() { # wait_for SECONDS WHAT COMMAND...
    local until=$((SECONDS + $1)) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $until ] || fail "$what did not come up within the time allowed (logs in $DIR)"
        sleep 0.2
    done
}

[ "$(id -u)" = 0 ] || fail "needs root (it starts munged, MariaDB and the SLURM daemons)"
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null ||
        ! command -v munged >/dev/null; then
    [ "${1:-}" = --install ] || fail "slurm-wlm, slurmdbd, munge or mariadb-server is not installed (pass --install)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge slurmdbd \
        mariadb-server; } >"/tmp/andrea-slurm-apt.log" 2>&1 || fail "apt-get install failed (/tmp/andrea-slurm-apt.log)"
fi
if [ -f "$CONF" ] && ! head -1 "$CONF" | grep -q "^$MARK"; then
    fail "$CONF exists and is not this test cluster's: left alone"
fi
if [ -f "$CONF" ] && up; then
    exit 0
fi

mkdir -p "$DIR/state" "$DIR/spool" /etc/slurm /run/munge /run/mysqld
cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
[ -s "$DIR/db-pass" ] || (umask 077 && head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/db-pass")
pass=$(cat "$DIR/db-pass")
{ echo "$MARK (tests/slurm/start_cluster.sh)"; sed -e "s|@DIR@|$DIR|g" -e "s|@MEM_MB@|$mem_mb|" \
    -e "s|@CPUS@|$cpus|" "$here/slurm.conf.in"; } >"$CONF"
(umask 077 && sed -e "s|@DIR@|$DIR|g" -e "s|@DB_PASS@|$pass|" "$here/slurmdbd.conf.in" >/etc/slurm/slurmdbd.conf)

# munge: the key Debian's package made, the daemon as its own user
chown munge:munge /run/munge
if ! alive /run/munge/munged.pid; then
    [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create --keyfile /etc/munge/munge.key
    runuser -u munge -- munged --force
fi
wait_for 10 munged munge -n

# MariaDB: its own data directory (with its log and PID) under $DIR, the socket where the client library looks by default
chown mysql:mysql /run/mysqld
if ! alive "$DIR/mysql/mariadb.pid"; then
    if [ ! -d "$DIR/mysql/mysql" ]; then
        mkdir -p "$DIR/mysql" && chown mysql:mysql "$DIR/mysql"
        mariadb-install-db --user=mysql --datadir="$DIR/mysql" --skip-test-db >"$DIR/mariadb-install.log" 2>&1 ||
            fail "mariadb-install-db failed ($DIR/mariadb-install.log)"
    fi
    setsid mariadbd --user=mysql --datadir="$DIR/mysql" --socket=/run/mysqld/mysqld.sock --skip-networking \
        --pid-file="$DIR/mysql/mariadb.pid" --log-error="$DIR/mysql/mariadb.log" </dev/null >/dev/null 2>&1 &
fi
wait_for 30 MariaDB mariadb -e "select 1"
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
    ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || fail "could not make the accounting database's user"

# the accounting daemon, then the cluster's record in it, then the controller and the node
alive "$DIR/slurmdbd.pid" || slurmdbd
wait_for 30 slurmdbd sacctmgr -n list cluster
sacctmgr -i -Q add cluster andrea >/dev/null 2>&1 || true  # already there: fine
alive "$DIR/slurmctld.pid" || slurmctld
alive "$DIR/slurmd.pid" || slurmd -N localhost
wait_for 30 "slurmctld and slurmd" up
# a node left drained by an earlier run of the daemons takes jobs again
scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
echo "slurm test cluster up: $(sinfo -h -N -o '%N %c CPUs %m MB %T'), accounting by slurmdbd (logs in $DIR)"
