#!/usr/bin/env bash
# After `e2e/cluster down`: no process, mount, cgroup, network namespace, veth
# or state of the cluster is left. Run by e2e/test.sh right after down.
source "$(dirname "$0")/lib.sh"
source "$E2E_DIR/lib/procs.sh"

problems=()
[[ -e $STATE ]] && problems+=("state dir $STATE exists")
for d in $(cgroup_dirs); do [[ -d $d ]] && problems+=("cgroup $d exists"); done
for p in /proc/[0-9]*; do
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  if [[ $exe == "$K8S_BIN"/* ]] || tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF "$STATE/"; then
    problems+=("process ${p#/proc/} still runs: $exe")
  fi
done
mounts=$(awk -v s="$STATE" -v n="/run/netns/$NETNS" 'index($5, s) == 1 || $5 == n { print $5 }' /proc/self/mountinfo)
[[ -n $mounts ]] && problems+=("mounts left: $(tr '\n' ' ' <<<"$mounts")")
for n in /run/netns/"$NETNS" /run/netns/"$NETNS"-[0-9]*; do [[ -e $n ]] && problems+=("netns ${n##*/} exists"); done
ip link show kiln-h >/dev/null 2>&1 && problems+=("veth kiln-h exists")
if ((${#problems[@]})); then
  printf 'left behind: %s\n' "${problems[@]}"
  exit 1
fi
echo "nothing left behind"
