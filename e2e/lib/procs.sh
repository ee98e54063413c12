# shellcheck shell=bash
# Starting, tracking and stopping the cluster's processes. Sourced by e2e/cluster.
#
# Every process is started into the cgroup "kiln-e2e" (pids, memory, cpu and
# cpuacct hierarchies on cgroup v1; the node's own cgroup on v2), and the
# kubelet's cgroupRoot is that same cgroup. So whatever the cluster forks —
# containerd shims, pause, containers — stays under one cgroup subtree, which
# `down` empties by PID and removes: nothing is found by process name.

CGROUP_NAME=kiln-e2e
PIDS=$STATE/pids
LOGS=$STATE/logs

# cgroup_dirs: the kiln-e2e cgroup in every mounted hierarchy (created by up).
cgroup_dirs() {
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    echo "/sys/fs/cgroup/$CGROUP_NAME"
    return
  fi
  local d
  for d in /sys/fs/cgroup/*/; do
    [[ -L ${d%/} ]] && continue # cpu,cpuacct style alias links
    grep -qE " ${d%/} cgroup2? " /proc/mounts || continue # v1, and hybrid mode's v2
    echo "${d}$CGROUP_NAME"
  done
}

# The cgroups each started process joins: a "components" child of kiln-e2e (of
# kiln-e2e/NODE for an extra node's components), so that kiln-e2e itself holds
# only child cgroups (cgroup v2 requires that once the kubelet enables
# controllers for its kubepods child).
join_dirs() {
  local sub=$CGROUP_NAME${N_CGROUP:+/$N_CGROUP}
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    echo "/sys/fs/cgroup/$sub/components"
    return
  fi
  local h
  for h in pids memory cpu cpuacct; do
    [[ -d /sys/fs/cgroup/$h/$CGROUP_NAME ]] && echo "/sys/fs/cgroup/$h/$sub/components"
  done
}

# make_cgroups: kiln-e2e and its components child; for an extra node (N_CGROUP
# set), also kiln-e2e/NODE, the node's kubelet cgroupRoot, with its own
# components child.
make_cgroups() {
  local top d
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    sed 's/\([a-z_]*\)/+\1/g' /sys/fs/cgroup/cgroup.controllers >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  fi
  for top in $(cgroup_dirs); do
    for d in "$top" "$top/components" ${N_CGROUP:+"$top/$N_CGROUP" "$top/$N_CGROUP/components"}; do
      [[ -d $d ]] && continue
      mkdir "$d"
      if [[ -f $d/cpuset.cpus ]]; then # v1 cpuset children start empty
        cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
        cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
      fi
    done
  done
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    for d in "$CGROUP_NAME" ${N_CGROUP:+"$CGROUP_NAME/$N_CGROUP"}; do
      sed 's/\([a-z_]*\)/+\1/g' "/sys/fs/cgroup/$d/cgroup.controllers" \
        >"/sys/fs/cgroup/$d/cgroup.subtree_control" 2>/dev/null || true
    done
  fi
}

# cgroup_pids [SUB]: every PID in the kiln-e2e subtree (in kiln-e2e/SUB, an
# extra node's, when given).
cgroup_pids() {
  local d
  for d in $(cgroup_dirs); do
    d+=${1:+/$1}
    # A cgroup that goes away while it is read (a node's, during down) is not an error: under
    # pipefail that failure made `down` exit at once with nothing said.
    if [[ -d $d ]]; then find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
  done | sort -un
}

# alive NAME: the recorded PID of NAME still runs the binary it was started as.
alive() {
  local pidfile=$PIDS/$1.pid pid exe
  [[ -f $pidfile ]] || return 1
  read -r pid exe <"$pidfile"
  [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]]
}

# start NAME BINARY ARGS...: run BINARY inside the current node's network
# namespace ($N_NETNS, node_env) and cgroup, detached, logging to
# $LOGS/NAME.log; no-op when NAME is already alive.
start() {
  local name=$1 bin=$2; shift 2
  alive "$name" && return 0
  mkdir -p "$PIDS" "$LOGS"
  log "starting $name"
  local joins
  joins=$(join_dirs)
  (
    for d in $joins; do echo "$BASHPID" >"$d/cgroup.procs"; done
    # Close every inherited descriptor beyond stdio: a component that kept the caller's
    # `flock /tmp/kiln-e2e.lock` descriptor would hold the e2e lock for as long as it runs.
    local fd
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec setsid nsenter --net="/run/netns/${N_NETNS:-$NETNS}" "$bin" "$@"
  ) >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo "$! $(readlink -f "$bin")" >"$PIDS/$name.pid"
}

# stop NAME: SIGTERM, then SIGKILL after a grace period.
stop() {
  local name=$1 pid exe i
  alive "$name" || { rm -f "$PIDS/$name.pid"; return 0; }
  read -r pid exe <"$PIDS/$name.pid"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    alive "$name" || break
    sleep 0.2
  done
  alive "$name" && kill -KILL "$pid" 2>/dev/null
  rm -f "$PIDS/$name.pid"
}

# kill_cgroup [SUB]: SIGKILL whatever is left in the subtree (shims, pods), or in
# an extra node's kiln-e2e/SUB.
kill_cgroup() {
  local i pids
  for ((i = 0; i < 50; i++)); do
    pids=$(cgroup_pids "${1:-}")
    [[ -z $pids ]] && return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  log "warning: processes survive in cgroup $CGROUP_NAME: $(cgroup_pids | tr '\n' ' ')"
}

remove_cgroups() {
  local d
  for d in $(cgroup_dirs); do
    [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  true
}

# wait_for WHAT SECONDS CMD...: poll CMD until it succeeds.
wait_for() {
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}
