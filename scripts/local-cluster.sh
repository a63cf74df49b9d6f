#!/usr/bin/env bash
# An emulated cluster on this machine: N hosts as Linux network namespaces, each with its own address and host
# name, joined by a bridge; mpirun runs inside host 0 and starts the other hosts' daemons through a launch agent
# (instead of ssh), so Open MPI sees N nodes: shared memory within a host, TCP between hosts.
#
#   scripts/local-cluster.sh up N [--slots S]     create hosts h0..h(N-1) (10.200.0.1..N), S slots each (default 2)
#   scripts/local-cluster.sh run MPIRUN-ARGS...   mpirun inside h0 with the cluster's flags (yours override them)
#   scripts/local-cluster.sh torchrun [--nnodes K] [--nproc_per_node S] [--max-restarts R] PROGRAM ARGS...
#                                                torchrun's multi-node form, an agent in each of hosts 0..K-1
#   scripts/local-cluster.sh slurm up|run CMD...|down   a real Slurm on the hosts (scripts/local-slurm.sh)
#   scripts/local-cluster.sh shape RATE [DELAY]   shape every host's link, e.g. "shape 1gbit 0.1ms"; "shape off"
#   scripts/local-cluster.sh status               hosts, addresses, shaping, processes
#   scripts/local-cluster.sh down                 remove everything up made (safe to repeat)
#
# Environment: HOPWISE_CLUSTER_PREFIX (host name prefix, default h) and HOPWISE_CLUSTER_SUBNET (first three
# octets of the /24, default 10.200.0) let two clusters coexist; HOPWISE_CLUSTER_STATE_ROOT (default
# /run/hopwise-cluster) holds each cluster's state: agent, hostfile, settings.
# Needs root and iproute2 (ip, tc), util-linux (unshare); a link DELAY also needs iptables and
# build/bin/hopwise-link-delay (built where libnetfilter-queue is installed).
set -Eeuo pipefail

# shellcheck source=scripts/cluster-env.sh
. "$(dirname "$0")/cluster-env.sh"
bridge=hwbr-$prefix

usage() {
  sed -n '6,13p' "$0" | sed 's/^# \{0,1\}//' >&"$((${1:-2} == 0 ? 1 : 2))"
  exit "${1:-2}"
}

need_root() {
  [ "$(id -u)" -eq 0 ] ||
    die "'$1' must run as root: network namespaces, veths and qdiscs need CAP_SYS_ADMIN and CAP_NET_ADMIN (try sudo)"
}

need_tools() {
  local missing=()
  for t in "$@"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] ||
    die "missing ${missing[*]}: install iproute2 (ip, tc) and util-linux (unshare), e.g. with scripts/setup.sh"
}

netns_exists() { [ -e "/run/netns/$1" ]; }
veth() { echo "hw-$prefix$1"; }   # the root-namespace end of host i's link

cmd_up() {
  local n="" slots=2
  while [ $# -gt 0 ]; do
    case $1 in
      --slots) [ $# -ge 2 ] || usage; slots=$2; shift 2 ;;
      --slots=*) slots=${1#--slots=}; shift ;;
      *) [ -z "$n" ] || usage; n=$1; shift ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "up: give the number of hosts, 1 to 250 (got '${n}')"
  [[ $slots =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] || die "up: --slots must be a positive number (got '$slots')"
  need_root up
  need_tools ip tc unshare
  mkdir -p "$state_root"
  exec 9>"$state_root/.lock-$prefix"
  flock 9
  if [ -e "$state/cluster.env" ] || [ -e "$state/created" ]; then
    die "cluster '$prefix' is already up ($state); run '$0 down' first, or set HOPWISE_CLUSTER_PREFIX and HOPWISE_CLUSTER_SUBNET for a second one"
  fi
  local i
  for ((i = 0; i < n; i++)); do
    ! netns_exists "$(host "$i")" || die "up: a network namespace $(host "$i") already exists and is not this script's; remove it or set HOPWISE_CLUSTER_PREFIX"
  done
  ! ip link show "$bridge" >/dev/null 2>&1 || die "up: a link named $bridge already exists and is not this script's"
  mkdir -p "$state"
  # Everything made is listed before it is made, so that down removes it even after a failed up.
  : >"$state/created"
  trap 'echo "local-cluster.sh: up failed; removing what it made" >&2; cmd_down >/dev/null 2>&1 || true' ERR

  echo "bridge $bridge" >>"$state/created"
  ip link add name "$bridge" type bridge
  # No address on the bridge: the root namespace takes no part in the cluster's network.
  [ ! -e "/proc/sys/net/ipv6/conf/$bridge/disable_ipv6" ] || echo 1 >"/proc/sys/net/ipv6/conf/$bridge/disable_ipv6"
  ip link set "$bridge" up

  local hosts_file
  hosts_file=$(printf '127.0.0.1 localhost\n::1 localhost\n'; for ((i = 0; i < n; i++)); do echo "$(address "$i") $(host "$i")"; done)
  for ((i = 0; i < n; i++)); do
    local h v
    h=$(host "$i")
    v=$(veth "$i")
    echo "netns $h" >>"$state/created"
    ip netns add "$h"
    echo "etc $h" >>"$state/created"
    # ip netns exec bind-mounts these over /etc inside the host: names resolve locally, no DNS query leaves.
    mkdir -p "/etc/netns/$h"
    echo "$hosts_file" >"/etc/netns/$h/hosts"
    : >"/etc/netns/$h/resolv.conf"
    echo "$h" >"/etc/netns/$h/hostname"
    ip link add "$v" type veth peer name eth0 netns "$h"
    [ ! -e "/proc/sys/net/ipv6/conf/$v/disable_ipv6" ] || echo 1 >"/proc/sys/net/ipv6/conf/$v/disable_ipv6"
    ip link set "$v" master "$bridge" up
    ip -n "$h" link set lo up
    ip -n "$h" addr add "$(address "$i")/24" dev eth0
    ip -n "$h" link set eth0 up
  done

  for ((i = 0; i < n; i++)); do echo "$(host "$i") slots=$slots"; done >"$state/hostfile"
  # Open MPI's launch agent (in place of ssh): "agent HOST orted ARGS..." runs orted inside HOST under its name.
  cat >"$state/agent" <<'EOF'
#!/bin/sh
# Launch agent for Open MPI (plm_rsh_agent): runs the remaining words inside the named host's namespace, with
# that host's name, through a shell as ssh would.
h=$1
shift
exec ip netns exec "$h" unshare --uts sh -c "hostname $h; $*"
EOF
  chmod 755 "$state/agent"
  printf 'N=%s\nSLOTS=%s\n' "$n" "$slots" >"$state/cluster.env"
  trap - ERR
  echo "cluster '$prefix' up: $n hosts ($(host 0)..$(host $((n - 1))), $(address 0)..$(address $((n - 1)))), $slots slots each"
  echo "  run:   $0 run -np $((n * slots)) build/bin/hopwise-bench -b 1M -e 64M -f 4"
  echo "  state: $state (hostfile, agent)"
}

# Stops the delay helpers and every process left inside the hosts, by PID.
stop_processes() {
  local h pids
  for f in "$state"/delay-*.pid; do
    [ -e "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  for h in "$@"; do
    netns_exists "$h" || continue
    pids=$(ip netns pids "$h" 2>/dev/null || true)
    [ -z "$pids" ] || kill $pids 2>/dev/null || true
  done
  for h in "$@"; do
    netns_exists "$h" || continue
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      pids=$(ip netns pids "$h" 2>/dev/null || true)
      [ -n "$pids" ] || break
      sleep 0.1
    done
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  done
}

cmd_down() {
  need_root down
  [ -d "$state" ] || { echo "cluster '$prefix' is not up; nothing to remove"; return 0; }
  [ ! -d "$state/slurm" ] || "$repo/scripts/local-slurm.sh" down >/dev/null || true
  local hosts=() kind name
  if [ -f "$state/created" ]; then
    while read -r kind name; do [ "$kind" != netns ] || hosts+=("$name"); done <"$state/created"
  fi
  stop_processes "${hosts[@]}"
  if [ -f "$state/created" ]; then
    while read -r kind name; do
      case $kind in
        netns) ! netns_exists "$name" || ip netns del "$name" ;;   # takes its veth and qdiscs along
        etc) rm -rf "/etc/netns/${name:?}"; rm -rf /tmp/ompi."$name".* ;;
        bridge) ! ip link show "$name" >/dev/null 2>&1 || ip link del "$name" ;;
      esac
    done <"$state/created"
  fi
  rmdir /etc/netns 2>/dev/null || true
  rm -rf "${state:?}"
  rm -f "$state_root/.lock-$prefix"
  rmdir "$state_root" 2>/dev/null || true
  echo "cluster '$prefix' down"
}

# Open MPI rejects an MCA parameter given twice, so a default is dropped when the user's arguments set it.
cmd_run() {
  need_root run
  need_tools ip unshare mpirun
  load_state
  netns_exists "$(host 0)" || die "run: host $(host 0) is gone; run '$0 down' then '$0 up N'"
  local -A user_mca=() user_x=()
  local user_hosts=0 user_bind=0 a prev=""
  for a in "$@"; do
    case $prev in
      --mca | -mca | --gmca | -gmca) user_mca[$a]=1 ;;
      -x) user_x[${a%%=*}]=1 ;;
    esac
    case $a in
      --hostfile | -hostfile | --machinefile | -machinefile | --host | -host | -H | --default-hostfile) user_hosts=1 ;;
      --bind-to | -bind-to | --bind-to=*) user_bind=1 ;;
    esac
    prev=$a
  done
  local net="$subnet.0/24"
  local defaults=(
    plm rsh
    plm_rsh_agent "$state/agent"
    plm_rsh_no_tree_spawn 1                # the agent starts every daemon from host 0
    oob_tcp_if_include "$net"
    btl_tcp_if_include "$net"
    pml ob1
    btl tcp,vader,self                     # shared memory within a host, TCP between hosts
    btl_tcp_links 2                        # with one connection per pair, traffic both ways got half a shaped link
    mpi_yield_when_idle 1                  # busy-polling ranks on few cores let each other run
  )
  local args=()
  [ "$(id -u)" -ne 0 ] || args+=(--allow-run-as-root)
  for ((k = 0; k < ${#defaults[@]}; k += 2)); do
    [ -n "${user_mca[${defaults[k]}]:-}" ] || args+=(--mca "${defaults[k]}" "${defaults[k + 1]}")
  done
  [ $user_hosts -eq 1 ] || args+=(--hostfile "$state/hostfile")
  # Unbound: otherwise every host binds its first rank to core 0 and ranks on different hosts share one core.
  [ $user_bind -eq 1 ] || args+=(--bind-to none)
  local v
  for v in $(compgen -e | grep '^HOPWISE_' || true); do
    [ -n "${user_x[$v]:-}" ] || args+=(-x "$v")
  done
  . "$repo/scripts/mpi-env.sh"
  cd "$repo"
  in_host 0 mpirun "${args[@]}" "$@"
}

# torchrun's multi-node form, one agent per host, started inside each host's namespace under its name:
# --nnodes N --node_rank i --master_addr <h0's address>. Each program rank then meets the others through
# hopwise's TCP store (rank 0, in h0) and talks over UCX: shared memory within a host, TCP between hosts. torchrun is
# the torch environment's (scripts/venv.sh), run with --redirects 1 --tee 1; output lines start with the host.
cmd_torchrun() {
  need_root torchrun
  need_tools ip unshare
  local torchrun
  torchrun="$("$repo/scripts/venv.sh" --path)/bin/torchrun"
  [ -x "$torchrun" ] || torchrun=$(command -v torchrun) || die "torchrun: no torch environment; run scripts/setup.sh"
  load_state
  local per_node=1 nodes=$N restarts=0
  while [ $# -gt 0 ]; do
    case $1 in
      --nnodes) [ $# -ge 2 ] || usage; nodes=$2; shift 2 ;;
      --nnodes=*) nodes=${1#*=}; shift ;;
      --nproc_per_node | --nproc-per-node) [ $# -ge 2 ] || usage; per_node=$2; shift 2 ;;
      --nproc_per_node=* | --nproc-per-node=*) per_node=${1#*=}; shift ;;
      --max-restarts | --max_restarts) [ $# -ge 2 ] || usage; restarts=$2; shift 2 ;;
      *) break ;;
    esac
  done
  [ $# -ge 1 ] || die "torchrun: give the program to run, e.g. build/bin/hopwise-bench"
  [[ $per_node =~ ^[0-9]+$ ]] && [ "$per_node" -ge 1 ] || die "torchrun: --nproc_per_node must be a positive number"
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le "$N" ] ||
    die "torchrun: --nnodes must be 1 to $N (the cluster's hosts)"
  local port=$((29400 + RANDOM % 500)) i pids=() rc=0 worst=0
  cd "$repo"
  for ((i = 0; i < nodes; i++)); do
    (
      set -o pipefail
      in_host "$i" "$torchrun" --nnodes "$nodes" --node_rank "$i" --nproc_per_node "$per_node" \
        --max-restarts "$restarts" --master_addr "$(address 0)" --master_port "$port" --redirects 1 --tee 1 --no_python "$@" 2>&1 |
        sed -u "s/^/[$(host "$i")] /"
    ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || rc=$?
    [ "$rc" -le "$worst" ] || worst=$rc
  done
  return "$worst"
}

# Parses a tc rate ("1gbit", "100mbit", "2.5gbit", "500kbit", "1000000") into bits per second.
rate_bits() {
  local r=${1,,} num unit
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)?$ ]] ||
    die "shape: rate '$1' not understood; write e.g. 1gbit, 100mbit, 2.5gbit or 500kbit"
  num=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[3]:-bit}
  awk -v n="$num" -v u="$unit" 'BEGIN {
    m = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : (u == "tbit") ? 1e12 : 1
    printf "%.0f\n", n * m }'
}

# Parses "0.1ms", "100us", "2ms", "1s" into microseconds.
delay_us() {
  local d=${1,,}
  [[ $d =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || die "shape: delay '$1' not understood; write e.g. 100us, 0.1ms or 2ms"
  awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" 'BEGIN {
    m = (u == "us") ? 1 : (u == "ms") ? 1e3 : 1e6; printf "%.0f\n", n * m }'
}

cmd_shape() {
  [ $# -ge 1 ] && [ $# -le 2 ] || usage
  need_root shape
  need_tools ip tc
  load_state
  local i h
  for ((i = 0; i < N; i++)); do
    h=$(host "$i")
    tc qdisc del dev "$(veth "$i")" root 2>/dev/null || true
    ip netns exec "$h" tc qdisc del dev eth0 root 2>/dev/null || true
  done
  stop_delay
  if [ "$1" = off ]; then
    [ $# -eq 1 ] || usage
    rm -f "$state/shape"
    echo "links unshaped"
    return 0
  fi
  local bits burst delay=""
  bits=$(rate_bits "$1")
  [ "$bits" -ge 8000 ] || die "shape: rate '$1' is below 8 kbit/s"
  [ $# -lt 2 ] || delay=$(delay_us "$2")
  # tbf each way: on the root-side veth (into the host) and on eth0 inside it (out of it). Burst: 2 ms at the
  # rate, at least 256 KiB, so that one TCP window's burst is not cut.
  burst=$(awk -v b="$bits" 'BEGIN { x = b / 8 * 0.002; if (x < 262144) x = 262144; printf "%.0f\n", x }')
  for ((i = 0; i < N; i++)); do
    h=$(host "$i")
    tc qdisc add dev "$(veth "$i")" root tbf rate "$bits" burst "$burst" latency 10ms
    ip netns exec "$h" tc qdisc add dev eth0 root tbf rate "$bits" burst "$burst" latency 10ms
  done
  if [ -n "$delay" ] && [ "$delay" -gt 0 ]; then start_delay "$delay"; fi
  echo "rate=$1 delay=${2:-0}" >"$state/shape"
  echo "links shaped: $1 each way per host${2:+, $2 one-way delay (held at the receiver)}"
}

# Delay without netem (not in every kernel): inside each host, iptables queues every packet arriving on eth0
# to hopwise-link-delay, which releases it after the delay.
start_delay() {
  local us=$1 helper=${HOPWISE_LINK_DELAY:-$repo/build/bin/hopwise-link-delay} i h
  need_tools iptables
  [ -x "$helper" ] ||
    die "shape: a delay needs $helper (built when libnetfilter-queue-dev is installed; run scripts/setup.sh and scripts/build.sh)"
  for ((i = 0; i < N; i++)); do
    h=$(host "$i")
    ip netns exec "$h" iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0 --queue-bypass
    ip netns exec "$h" setsid "$helper" --queue 0 --delay-us "$us" </dev/null >"$state/delay-$h.log" 2>&1 &
    echo $! >"$state/delay-$h.pid"
  done
  sleep 0.2
  for ((i = 0; i < N; i++)); do
    h=$(host "$i")
    kill -0 "$(cat "$state/delay-$h.pid")" 2>/dev/null || die "shape: the delay helper in $h stopped: $(cat "$state/delay-$h.log")"
  done
}

stop_delay() {
  local i h f
  for ((i = 0; i < N; i++)); do
    h=$(host "$i")
    f=$state/delay-$h.pid
    if [ -e "$f" ]; then
      kill "$(cat "$f")" 2>/dev/null || true
      rm -f "$f" "$state/delay-$h.log"
      ip netns exec "$h" iptables -t mangle -F PREROUTING 2>/dev/null || true
    fi
  done
}

cmd_status() {
  if [ ! -f "$state/cluster.env" ]; then
    echo "cluster '$prefix': down"
    return 0
  fi
  need_root status
  load_state
  echo "cluster '$prefix': up, $N hosts, $SLOTS slots each; state in $state"
  echo "links: $(cat "$state/shape" 2>/dev/null || echo unshaped)"
  local i h procs
  for ((i = 0; i < N; i++)); do
    h=$(host "$i")
    if ! netns_exists "$h"; then
      echo "  $h: MISSING (run '$0 down' then '$0 up $N')"
      continue
    fi
    procs=$(ip netns pids "$h" 2>/dev/null | wc -l)
    printf '  %-8s %-15s eth0 %s, %s process(es)\n' "$h" "$(address "$i")" \
      "$(ip -n "$h" -br link show eth0 2>/dev/null | awk '{print $2}')" "$procs"
  done
}

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  up) cmd_up "$@" ;;
  down) [ $# -eq 0 ] || usage; cmd_down ;;
  run) [ $# -ge 1 ] || usage; cmd_run "$@" ;;
  torchrun) cmd_torchrun "$@" ;;
  slurm) exec "$repo/scripts/local-slurm.sh" "$@" ;;
  shape) cmd_shape "$@" ;;
  status) [ $# -eq 0 ] || usage; cmd_status ;;
  -h | --help | help) usage 0 ;;
  *) echo "local-cluster.sh: unknown command '$command'" >&2; usage ;;
esac
