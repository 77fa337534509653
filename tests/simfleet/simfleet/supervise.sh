#!/bin/sh
# Keep one simulated node booted.
#
# usage: SIMFLEET_CGROUP=NAME supervise.sh NODE_DIR systemd-nspawn ARGS...
#
# Runs systemd-nspawn and decides on its exit status:
#   133  the node rebooted: start it again (unless NODE_DIR/reboot_hang exists: then wait,
#        without a node, until that file is removed, as a reboot that never comes back);
#   0    the node powered off: stop;
#   else nspawn failed or was killed: start again after a second; give up after 5 quick failures.
# SIGTERM/SIGINT/SIGHUP: pass SIGTERM to nspawn (which powers the node off cleanly), wait, stop.
# Writes NODE_DIR/nspawn.pid and NODE_DIR/init.pid while nspawn runs and NODE_DIR/supervisor.state
# (running | hung | restarting | stopped | failed). A small POSIX shell process, so 32 nodes cost
# almost no memory for supervision.
#
# Each node gets its own cgroup, NAME below the supervisor's own cgroup (NODE_DIR/cgroups lists
# the directories): `systemd-nspawn --keep-unit` builds the node's tree (payload/, supervisor/)
# inside the cgroup it starts in, so nodes started from one cgroup would share one tree and their
# systemds would remove each other's cgroups. The tree is removed when the supervisor ends.
set -u
node_dir=$1
shift
stop=0
child=""
init=""
own_pidns=$(readlink /proc/$$/ns/pid)

say() { echo "$(date '+%Y-%m-%dT%H:%M:%S') $*"; }
setstate() {
    echo "$1" > "$node_dir/supervisor.state.tmp" && mv -f "$node_dir/supervisor.state.tmp" "$node_dir/supervisor.state"
}
# The node's init: the child of nspawn that lives in a new pid namespace. Recorded because it
# outlives an nspawn that is killed (SIGKILL) and must then be killed before the next boot.
find_init() {
    tries=0
    while [ "$tries" -lt 100 ] && kill -0 "$child" 2>/dev/null; do
        kids=$(cat /proc/"$child"/task/*/children 2>/dev/null)
        for c in $kids; do
            ns=$(readlink /proc/"$c"/ns/pid 2>/dev/null) || continue
            if [ -n "$ns" ] && [ "$ns" != "$own_pidns" ]; then
                echo "$c"
                return 0
            fi
        done
        sleep 0.1
        tries=$((tries + 1))
    done
    return 1
}
# Kill a node init left without its nspawn (only if its command line still names this node).
reap_init() {
    if [ -n "$init" ] && kill -0 "$init" 2>/dev/null \
        && tr '\0' ' ' < /proc/"$init"/cmdline 2>/dev/null | grep -qF -- "$node_dir"; then
        say "killing the node's init (pid $init) left without nspawn"
        kill -KILL "$init" 2>/dev/null
        tries=0
        while [ "$tries" -lt 100 ] && kill -0 "$init" 2>/dev/null; do
            sleep 0.1
            tries=$((tries + 1))
        done
    fi
    init=""
    rm -f "$node_dir/init.pid"
}
cg_dirs=""
setup_cgroup() {
    [ -n "${SIMFLEET_CGROUP:-}" ] || return 0
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        roots="/sys/fs/cgroup"
    else
        roots="/sys/fs/cgroup/systemd /sys/fs/cgroup/unified"
    fi
    for root in $roots; do
        [ -d "$root" ] || continue
        case "$root" in
            */systemd) own=$(sed -n 's/^[0-9]*:name=systemd:\(.*\)$/\1/p' /proc/self/cgroup) ;;
            *) own=$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup) ;;
        esac
        dir="$root${own%/}/$SIMFLEET_CGROUP"
        if mkdir -p "$dir" && echo $$ > "$dir/cgroup.procs"; then
            cg_dirs="$cg_dirs $dir"
        else
            say "warning: could not move into cgroup $dir"
        fi
    done
    echo "$cg_dirs" > "$node_dir/cgroups"
}
cleanup_cgroup() {
    for dir in $cg_dirs; do
        # back to the cgroup the supervisor started in, then remove the node's tree (and its
        # parent directories up to there, when no other node uses them)
        origin=${dir%/"$SIMFLEET_CGROUP"}
        echo $$ > "$origin/cgroup.procs" 2>/dev/null
        find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null
        parent=${dir%/*}
        while [ "$parent" != "$origin" ] && [ "${#parent}" -gt "${#origin}" ]; do
            rmdir "$parent" 2>/dev/null || break
            parent=${parent%/*}
        done
    done
    rm -f "$node_dir/cgroups"
}
on_term() {
    stop=1
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; fi
}
trap on_term TERM INT HUP

setup_cgroup
quick_failures=0
while [ "$stop" -eq 0 ]; do
    started=$(date +%s)
    "$@" </dev/null >>"$node_dir/console.log" 2>&1 &
    child=$!
    echo "$child" > "$node_dir/nspawn.pid"
    setstate running
    say "started systemd-nspawn (pid $child)"
    # a stop request that came before $child was known
    if [ "$stop" -eq 1 ]; then kill -TERM "$child" 2>/dev/null; fi
    if init=$(find_init); then
        echo "$init" > "$node_dir/init.pid"
    else
        init=""
    fi
    while :; do
        wait "$child"
        rc=$?
        # wait returns >128 when a trapped signal interrupts it: nspawn may still be running
        if [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null; then continue; fi
        break
    done
    child=""
    rm -f "$node_dir/nspawn.pid"
    say "systemd-nspawn exited with status $rc"
    reap_init
    [ "$stop" -eq 1 ] && break
    case "$rc" in
        133)
            quick_failures=0
            if [ -e "$node_dir/reboot_hang" ]; then
                setstate hung
                say "fault reboot_hang: the node does not come back"
                while [ -e "$node_dir/reboot_hang" ] && [ "$stop" -eq 0 ]; do sleep 1; done
                say "reboot_hang cleared"
            fi
            ;;
        0)
            say "the node powered off"
            break
            ;;
        *)
            now=$(date +%s)
            if [ $((now - started)) -lt 30 ]; then
                quick_failures=$((quick_failures + 1))
            else
                quick_failures=0
            fi
            if [ "$quick_failures" -ge 5 ]; then
                setstate failed
                say "giving up after $quick_failures quick failures; see $node_dir/console.log"
                cleanup_cgroup
                exit 1
            fi
            setstate restarting
            sleep 1
            ;;
    esac
done
cleanup_cgroup
setstate stopped
say "stopped"
