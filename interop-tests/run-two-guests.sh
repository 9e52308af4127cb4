#!/bin/bash
# interop-tests/run-two-guests.sh — the "two hosts" rows of the interop matrix:
# gpusock and unmodified rdma-core 44 on two different guests, each with its
# own Soft-RoCE device, joined by a private link (scripts/rdma-vm
# --two-guests). Every other row of the matrix loops back inside one rxe
# device; these show the same conversations across a real link between two
# RDMA devices. Runs in both guests:
#
#   run-two-guests.sh servers --bin BUILD --out DIR   (guest B, --peer-cmd)
#       starts every server in the background (each serves one conversation)
#   run-two-guests.sh clients --bin BUILD --out DIR   (guest A)
#       runs the clients against B, one after another
#
# Both write logs into DIR/two (a --share of the host); scripts/interop judges
# the cases on the host afterwards from the logs of both sides (cases.tsv
# lists them). Round trips across the link cost about 20 ms under TCG
# (rdma-lab.md), so the conversations are short.
set -u
export LC_ALL=C
MODE=${1:?servers|clients}
shift
BIN= OUT=
while (($#)); do
	case $1 in
	--bin) BIN=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	*) echo "run-two-guests: unknown argument $1" >&2; exit 2 ;;
	esac
done
: "${RDMA_VM_ADDR:?run me inside scripts/rdma-vm --two-guests}" "${RDMA_VM_PEER_ADDR:?two guests needed}"
T=$BIN/interop-tests
FIX=$T/librs44_workaround.so
RSP=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
GSP=$BIN/preload/libgpusock_preload.so
D=$OUT/two
mkdir -p "$D"
export GPUSOCK_TRANSPORT=verbs

# id|section|peer|role|case|port|server command (B; $H = B's address)|client command (A; $H = B's address)
CASES=(
	"rs-gs-server|rsocket|rsocket API (librdmacm)|gs-server|size-65537B|7801|$T/gs_xfer_peer server size --size 65537 --addr \$H --port 7801 --deadline 240|$T/rs_xfer_peer client size --size 65537 --addr \$H --port 7801 --deadline 240 --retry 60"
	"rs-gs-client|rsocket|rsocket API (librdmacm)|gs-client|size-65537B|7802|$T/rs_xfer_peer server size --size 65537 --addr \$H --port 7802 --deadline 240|$T/gs_xfer_peer client size --size 65537 --addr \$H --port 7802 --deadline 240 --retry 60"
	"rs-baseline|rsocket|rsocket API (librdmacm)|baseline|size-65537B|7803|$T/rs_xfer_peer server size --size 65537 --addr \$H --port 7803 --deadline 240|$T/rs_xfer_peer client size --size 65537 --addr \$H --port 7803 --deadline 240 --retry 60"
	"rstream-gs-server|rstream|rstream (unmodified)|gs-server|4 KiB x 10 -T v|7804|$T/gs_rstream -b \$H -p 7804 -S 4096 -C 10 -T v|rstream -s \$H -p 7804 -S 4096 -C 10 -T v"
	"rstream-gs-client|rstream|rstream (unmodified)|gs-client|4 KiB x 10 -T v|7805|stdbuf -oL rstream -b \$H -p 7805 -S 4096 -C 10 -T v|$T/gs_rstream -s \$H -p 7805 -S 4096 -C 10 -T v"
	"gpu-rstream|gpu|GPU echo server (host backend) ← rstream|gs-server|64 B x 20 round trips -T v|7806|$BIN/gpu/bin/gpu_echo_server --host-backend --port 7806 --blocks 1 --threads 2 --seconds 600|rstream -s \$H -p 7806 -S 64 -C 1 -I 20 -T v"
	"gpu-plain|gpu|GPU echo server (host backend) ← plain client + librspreload|gs-server|1 B..64 KiB + 1 MiB bulk|7807|$BIN/gpu/bin/gpu_echo_server --host-backend --port 7807 --blocks 1 --threads 2 --seconds 600|EVENT_NOEPOLL=1 LD_PRELOAD='$FIX $RSP' $T/plain_echo_client \$H 7807 --sizes 1,2048,65537 --iters 3 --bulk 1048576"
	"shim-gs-server|shim|memcached on gpusock's shim ← memccp/memccat on librspreload|gs-server|64 KiB value|7808|GPUSOCK_LOG=info LD_PRELOAD=$GSP memcached -u root -l \$H -p 7808 -U 0 -t 1 -m 16 -v|memc"
)

case $MODE in
servers)
	export H=$RDMA_VM_ADDR
	: >"$D/cases.tsv"
	for c in "${CASES[@]}"; do
		IFS='|' read -r id section peer role name port srv cli <<<"$c"
		printf '%s\t%s\t%s\t%s\t%s\n' "$id" "$section" "$peer" "$role" "$name" >>"$D/cases.tsv"
		H=$H setsid timeout -k 3 280 bash -c "$srv" >"$D/$id.srv" 2>&1 </dev/null &
	done
	echo "run-two-guests: ${#CASES[@]} servers started on $H"
	;;
clients)
	export H=$RDMA_VM_PEER_ADDR
	HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
	sleep 5 # B's servers start in parallel with us (TCG: a second or two each)
	for c in "${CASES[@]}"; do
		IFS='|' read -r id section peer role name port srv cli <<<"$c"
		p0=$(($(cat "$HW/sent_pkts") + $(cat "$HW/rcvd_pkts")))
		t0=$SECONDS
		rc=1
		if [[ $cli == memc ]]; then
			# memccp/memccat a 64 KiB value under librspreload, byte-exact.
			head -c 65536 /dev/urandom >/tmp/val64k
			for _ in {1..20}; do
				EVENT_NOEPOLL=1 LD_PRELOAD="$FIX $RSP" timeout 60 memccp --servers="$H:$port" /tmp/val64k >>"$D/$id.cli" 2>&1 && break
				sleep 2
			done
			EVENT_NOEPOLL=1 LD_PRELOAD="$FIX $RSP" timeout 60 memccat --servers="$H:$port" val64k >/tmp/got64k 2>>"$D/$id.cli"
			if cmp -s -n 65536 /tmp/val64k /tmp/got64k && [[ $(stat -c %s /tmp/got64k) == 65537 ]]; then
				echo "OK memccp/memccat: 65536 B value stored and read back byte-exact" >>"$D/$id.cli"
				rc=0
			fi
		else
			# rstream does not retry a refused connect: retry it here (the
			# server is still waiting for its first connection).
			for _ in {1..30}; do
				H=$H timeout -k 3 200 bash -c "$cli" >"$D/$id.cli" 2>&1 </dev/null
				rc=$?
				((rc == 0)) && break
				grep -qiE 'refused|rdma_connect|failed to connect|ECONNREFUSED|No route' "$D/$id.cli" || break
				sleep 2
			done
		fi
		pk=$(($(cat "$HW/sent_pkts") + $(cat "$HW/rcvd_pkts") - p0))
		printf '%s\t%s\t%s\t%s\n' "$id" "$rc" "$((SECONDS - t0))" "$pk" >>"$D/clients.tsv"
		echo "run-two-guests: $id client exit $rc ($((SECONDS - t0)) s, $pk rxe0 packets)"
	done
	sleep 3 # let B's servers write their last lines
	;;
*)
	echo "run-two-guests: mode servers|clients" >&2
	exit 2
	;;
esac
