#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs an MPI program on two emulated nodes of one machine: each node is a Linux network namespace
# with its own host name and its own half of the cores; the nodes are joined by a veth pair, so
# Open MPI launches the second node's ranks through its remote launcher (an rsh agent entering
# that namespace) and their messages between the nodes take its TCP transport over a real network
# stack, while ranks of one node use shared memory. The links are those of this machine's kernel,
# not a cluster's network: the point is that pmt's node detection, link calibration and topology
# costing run as they would across nodes.
#
#   scripts/two_nodes.sh RANKS_PER_NODE program [args...]
#
# Needs root (network namespaces, CAP_NET_ADMIN), Open MPI's mpirun, iproute2 and util-linux;
# exits 77 (skipped) without them. The namespaces are removed on exit.
set -euo pipefail

if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 RANKS_PER_NODE program [args...]" >&2
  exit 2
fi
per_node=$1
shift
for tool in ip unshare taskset mpirun; do
  command -v "$tool" > /dev/null || { echo "two_nodes: $tool not found: skipped" >&2; exit 77; }
done

id="pmt$$"
ns0="${id}n0" ns1="${id}n1"
work=$(mktemp -d)
cleanup() {
  ip netns del "$ns0" 2> /dev/null || true
  ip netns del "$ns1" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if ! ip netns add "$ns0" 2> /dev/null || ! ip netns add "$ns1" 2> /dev/null; then
  echo "two_nodes: cannot create network namespaces (needs root with CAP_NET_ADMIN): skipped" >&2
  exit 77
fi
ip link add "${id}a" type veth peer name "${id}b"
ip link set "${id}a" netns "$ns0"
ip link set "${id}b" netns "$ns1"
ip -n "$ns0" addr add 10.213.0.1/24 dev "${id}a"
ip -n "$ns1" addr add 10.213.0.2/24 dev "${id}b"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "${id}a" up
ip -n "$ns1" link set "${id}b" up

# the cores this process may use, split in two halves: node 0 the first, node 1 the second
cpus=$(taskset -cp $$ | sed 's/.*: //')
mapfile -t all < <(echo "$cpus" | tr ',' '\n' | while IFS=- read -r lo hi; do seq "$lo" "${hi:-$lo}"; done)
if (( ${#all[@]} < 2 )); then
  echo "two_nodes: needs at least 2 cores (has ${#all[@]}): skipped" >&2
  exit 77
fi
half=$(( ${#all[@]} / 2 ))
cores0=$(IFS=,; echo "${all[*]:0:half}")
cores1=$(IFS=,; echo "${all[*]:half}")

# Open MPI's rsh agent: "[options] host command..." runs the command in that node's namespace,
# under its host name, on its cores
cat > "$work/agent" << EOF
#!/bin/bash
while [[ "\$1" == -* ]]; do shift; done
host=\$1
shift
case \$host in
  10.213.0.1) ns=$ns0 name=node0 cores=$cores0 ;;
  10.213.0.2) ns=$ns1 name=node1 cores=$cores1 ;;
  *) echo "two_nodes agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec \$ns unshare --uts taskset -c \$cores sh -c "hostname \$name; \$*"
EOF
chmod +x "$work/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_PROC_BIND=${OMP_PROC_BIND:-false}
# mpirun runs on node 0; ranks 0 .. per_node-1 there, the next per_node on node 1. The ranks
# yield while they wait (two may share a core), and Open MPI's out-of-band and TCP traffic stays
# on the link between the nodes.
args=(mpirun --host "10.213.0.1:$per_node,10.213.0.2:$per_node" -np $((2 * per_node))
      --mca plm_rsh_agent "$work/agent" --mca oob_tcp_if_include 10.213.0.0/24
      --mca btl self,vader,tcp --mca btl_tcp_if_include 10.213.0.0/24
      --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 --bind-to none
      -x OMP_NUM_THREADS -x OMP_PROC_BIND -x PATH)
[[ -n "${LD_LIBRARY_PATH:-}" ]] && args+=(-x LD_LIBRARY_PATH)
quoted=$(printf '%q ' "${args[@]}" "$@")
ip netns exec "$ns0" unshare --uts taskset -c "$cores0" sh -c "hostname node0; $quoted" < /dev/null
