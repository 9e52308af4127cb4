#!/bin/bash
# interop-tests/run-matrix.sh — the interop matrix, run INSIDE the Soft-RoCE
# guest (scripts/rdma-vm); scripts/interop boots the guest and renders the
# result. Every case runs gpusock (over GPUSOCK_TRANSPORT=verbs) against an
# unmodified rdma-core 44 program or library on rxe0, with a bound on every
# step, and appends one row to $OUT/results.tsv:
#   section  peer  role  case  status  seconds  note  rxe-packets
# status: PASS | FAIL | NS (not supported, checked to fail the expected way)
# Logs of each case: $OUT/logs/<id>.{srv,cli,...}.
#
#   run-matrix.sh --bin BUILD_DIR --out OUT_DIR [--only SECTION[,SECTION]]
# Sections: control rstream riostream rsocket memcached shim prefork gpu apps hostile errors proof
set -u
export LC_ALL=C
if [[ ${MATRIX_TRACE:-0} == 1 ]]; then # timing of every step, to stderr
	PS4='+ ${EPOCHREALTIME} '
	set -x
fi

BIN= OUT= ONLY=
while (($#)); do
	case $1 in
	--bin) BIN=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--only) ONLY=$2; shift 2 ;;
	*) echo "run-matrix: unknown argument $1" >&2; exit 2 ;;
	esac
done
: "${RDMA_VM_ADDR:?run me inside scripts/rdma-vm}"
[[ -n $BIN && -n $OUT ]] || { echo "usage: $0 --bin BUILD_DIR --out OUT_DIR" >&2; exit 2; }

A=$RDMA_VM_ADDR
T=$BIN/interop-tests
GSR=$T/gs_rstream
GSX=$T/gs_xfer_peer
RSX=$T/rs_xfer_peer
GSM=$T/gs_memcache
GSE=$T/gs_errcheck
HOST=$T/gs_hostile
PLAIN=$T/plain_echo_client
GSP=$BIN/preload/libgpusock_preload.so
GES=$BIN/gpu/bin/gpu_echo_server
FVS=$BIN/gpu/bin/fv_gpu_server
FVL=$BIN/gpu/bin/fv_load
FVC=$BIN/gpu/bin/fv_client
FIX=$T/librs44_workaround.so
RSP=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
HW=/sys/class/infiniband/rxe0/ports/1/hw_counters
PRELOAD="EVENT_NOEPOLL=1 LD_PRELOAD='$FIX $RSP'"
export GPUSOCK_TRANSPORT=verbs
export GPUSOCK_TEST_ADDR=$A

LOGS=$OUT/logs
RES=$OUT/results.tsv
SCR=/tmp/interop
mkdir -p "$LOGS" "$SCR"
rm -f "$LOGS"/* "$SCR"/*
printf 'section\tpeer\trole\tcase\tstatus\tseconds\tnote\trxe_pkts\n' >"$RES"

for f in "$GSR" "$GSX" "$RSX" "$GSM" "$GSE" "$HOST" "$FIX" "$RSP" "$PLAIN" "$GSP" "$GES" "$FVS" "$FVL" "$FVC"; do
	[[ -e $f ]] || { echo "run-matrix: missing $f (build the interop_peers target)" >&2; exit 2; }
done

PORT=7600
next_port() { PORT=$((PORT + 1)); }
want() { [[ -z $ONLY || ,$ONLY, == *,$1,* ]]; }
# Under TCG every fork+exec costs ~0.1 s: the helpers below use builtins only.
cnt() { local v=0; read -r v <"$HW/$1" 2>/dev/null; echo "$v"; }
now() { local t=${EPOCHREALTIME/,/.}; echo "${t%.*}${t#*.}"; } # microseconds
since() { local d=$(($(now) - $1)); printf '%d.%d' $((d / 1000000)) $((d / 100000 % 10)); }
exec {NAP_FD}<> <(:)
nap() { read -rt "$1" -u "$NAP_FD" _ 2>/dev/null; } # sleep without a process
oneline() { tr -s '\n\t' '  ' | cut -c1-"${2:-400}"; }

# record SECTION PEER ROLE CASE STATUS SECONDS NOTE [PKTS]
record() {
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$(printf '%s' "$7" | oneline)" "${8:-}" >>"$RES"
	printf '%-5s %-9s %-28s %-10s %-22s %5ss  %s\n' "$5" "$1" "$2" "$3" "$4" "$6" "$(printf '%s' "$7" | cut -c1-150)"
}

# Kernel TCP sockets on a port (there must be none: everything goes over
# rdma_cm). Reads the kernel's TCP tables (/proc/net/tcp{,6}, what ss shows)
# with builtins; ss_snapshot below runs the real `ss -tanp` on the long cases.
tcp_snapshot() { # ID PORT LABEL
	local out= hex l f
	printf -v hex '%04X' "$2"
	for f in /proc/net/tcp /proc/net/tcp6; do
		[[ -r $f ]] || continue
		mapfile -t lines <"$f"
		for l in "${lines[@]:1}"; do
			read -r _ loc rem st _ <<<"$l"
			[[ $loc == *:$hex || $rem == *:$hex ]] && out+="$f: $l"$'\n'
		done
	done
	# (may run in a subshell: counted in a file)
	if [[ -n $out ]]; then
		echo "$1 hit" >>"$SCR/tcp-snapshots"
		printf '%s %s\n' "$3" "$out" >>"$LOGS/$1.tcp"
	else
		echo "$1 clean" >>"$SCR/tcp-snapshots"
	fi
}

# `ss -tanp` itself (slow under TCG: used on the long cases), kept in the log.
ss_snapshot() { # ID PORT LABEL
	local out
	out=$(ss -Htanp 2>/dev/null)
	printf '%s: ss -tanp, %d TCP sockets in the guest, on port %s: %s\n' "$3" "$(grep -c . <<<"$out")" "$2" \
		"$(awk -v p=":$2" '$4 ~ p"$" || $5 ~ p"$"' <<<"$out" | tr '\n' ' ')" >>"$LOGS/$1.ss"
	if awk -v p=":$2" '$4 ~ p"$" || $5 ~ p"$" { f = 1 } END { exit !f }' <<<"$out"; then
		echo "$1 hit-ss" >>"$SCR/tcp-snapshots"
		printf '%s (ss) %s\n' "$3" "$(awk -v p=":$2" '$4 ~ p"$" || $5 ~ p"$"' <<<"$out" | tr '\n' ' ')" >>"$LOGS/$1.tcp"
	else
		echo "$1 clean-ss" >>"$SCR/tcp-snapshots"
	fi
}

# Waits up to S seconds for REGEX in FILE (or for PID to exit). 0 if seen.
wait_line() { # FILE REGEX SECONDS PID
	local end=$((SECONDS + $3)) l
	while ((SECONDS < end)); do
		if [[ -r $1 ]]; then
			mapfile -t lines <"$1"
			for l in "${lines[@]}"; do [[ $l =~ $2 ]] && return 0; done
		fi
		kill -0 "$4" 2>/dev/null || return 1
		nap 0.05
	done
	return 1
}

# Waits up to S seconds for PID; sets WAIT_RC (124 and a kill if it overran).
wait_pid() { # PID SECONDS
	local end=$((SECONDS + $2))
	while kill -0 "$1" 2>/dev/null && ((SECONDS < end)); do nap 0.05; done
	if kill -0 "$1" 2>/dev/null; then
		kill -KILL -- "-$1" 2>/dev/null || kill -KILL "$1" 2>/dev/null
		wait "$1" 2>/dev/null
		WAIT_RC=124
	else
		wait "$1"
		WAIT_RC=$?
	fi
}

# Starts SHELL-CMD in its own process group (so it can be killed whole) with
# a hard bound; sets BG_PID (= its process group id). Not in a $(...)
# subshell: the shell must stay its parent to `wait` for its status.
start_bg() { # LOG SECONDS SHELL-CMD
	setsid timeout -k 3 "$2" bash -c "$3" >"$1" 2>&1 </dev/null &
	BG_PID=$!
}
stop_bg() { # PID
	kill -TERM -- "-$1" 2>/dev/null
	local i
	for i in {1..40}; do kill -0 "$1" 2>/dev/null || break; nap 0.05; done
	kill -KILL -- "-$1" 2>/dev/null
	{ wait "$1"; } 2>/dev/null
}

# run_pair ID SECONDS READY-REGEX SERVER-CMD CLIENT-CMD
# Starts the server, waits for its ready line, runs the client, then waits for
# the server to finish. Sets SRV_RC CLI_RC DT PKTS (rxe0 packets sent+received).
run_pair() {
	local id=$1 t=$2 ready=$3 srv=$4 cli=$5 p0 t0 spid mid
	printf '%s\n%s\n' "server: $srv" "client: $cli" >"$LOGS/$id.cmd"
	p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
	t0=$(now)
	start_bg "$LOGS/$id.srv" "$t" "$srv"; spid=$BG_PID
	if [[ -n $ready ]]; then
		wait_line "$LOGS/$id.srv" "$ready" 20 "$spid" || echo "run-matrix: no ready line /$ready/ from the server" >>"$LOGS/$id.cli"
	else
		sleep 0.3 # the client retries a refused connect
	fi
	tcp_snapshot "$id" "$PORT" server-ready
	(nap 0.5; if [[ $id == *16MiB* || $id == control-* ]]; then ss_snapshot "$id" "$PORT" mid-run; else tcp_snapshot "$id" "$PORT" mid-run; fi) &
	mid=$!
	timeout -k 3 "$t" bash -c "$cli" >>"$LOGS/$id.cli" 2>&1 </dev/null
	CLI_RC=$?
	wait_pid "$spid" 20
	SRV_RC=$WAIT_RC
	wait "$mid" 2>/dev/null
	DT=$(since "$t0")
	PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
}

# The last OK/FAIL/RESULT line of a log, for the matrix note.
last_line() { grep -E '^(OK|FAIL|RESULT)' "$1" 2>/dev/null | tail -n 1 | oneline 300; }
tcp_clean() { [[ ! -s $LOGS/$1.tcp ]]; }

# Common verdict: both exit statuses 0, packets on rxe0, no TCP socket.
verdict_pair() { # ID  -> sets V (PASS|FAIL) and N (why)
	V=PASS N=
	((SRV_RC == 0)) || { V=FAIL; N+="server exit $SRV_RC; "; }
	((CLI_RC == 0)) || { V=FAIL; N+="client exit $CLI_RC; "; }
	((PKTS > 0)) || { V=FAIL; N+="no packets on rxe0; "; }
	tcp_clean "$1" || { V=FAIL; N+="kernel TCP socket seen on port; "; }
}

run_started=$(now)
P_START_S=$(cnt sent_pkts) P_START_R=$(cnt rcvd_pkts)
echo "run-matrix: guest $A, $(ibv_devinfo -d rxe0 | awk '/state:/ { print $2; exit }') rxe0, rdma-core $(dpkg-query -W -f='${Version}' rdmacm-utils)"

# ------------------------------------------------------------- control
# A kernel-TCP conversation must NOT move the rxe0 counters: shows they count
# RDMA traffic only (rstream -T s = standard sockets).
if want control; then
	next_port
	run_pair control-tcp 60 '^name' "stdbuf -oL rstream -T s -b $A -p $PORT -S 4096 -C 100" \
		"rstream -T s -s $A -p $PORT -S 4096 -C 100"
	if ((SRV_RC == 0 && CLI_RC == 0 && PKTS < 20)); then V=PASS; else V=FAIL; fi
	record control "kernel TCP (rstream -T s)" "-" "rxe counters ignore TCP" $V "$DT" \
		"400 KiB over kernel TCP moved $PKTS rxe0 packets (control: the counters only count RDMA)" "$PKTS"
	if grep -q '/proc/net/tcp' "$LOGS/control-tcp.tcp" 2>/dev/null && grep -q '(ss)' "$LOGS/control-tcp.tcp"; then V=PASS; else V=FAIL; fi
	record control "kernel TCP (rstream -T s)" "-" "the TCP checks see kernel TCP" $V "-" \
		"the same run, seen by both TCP checks the cases use: $(grep -m1 /proc/net/tcp "$LOGS/control-tcp.tcp" | oneline 110) / $(grep -m1 '(ss)' "$LOGS/control-tcp.tcp" | oneline 110)"
	sed -i '/^control-/d' "$SCR/tcp-snapshots" # this case is TCP on purpose
fi

# ------------------------------------------------------------- rstream
# gs_rstream speaks rstream's conversation (sync, -C transfers each way, -T v
# byte-counter verification) over gpusock.
RSTREAM_CASES=(
	"pingpong-64B|-S 64 -C 500 -T v"
	"blocking-2KiB|-S 2048 -C 100 -T b -T v"
	"async-poll-2KiB|-S 2048 -C 100 -T a -T v|-W"
	"size-1B|-S 1 -C 100 -T v"
	"size-2047B|-S 2047 -C 50 -T v"
	"size-2048B|-S 2048 -C 50 -T v"
	"size-65535B|-S 65535 -C 10 -T v"
	"size-65536B|-S 65536 -C 10 -T v"
	"size-65537B|-S 65537 -C 10 -T v"
	"size-1MiB|-S 1048576 -C 2 -T v"
	"size-16MiB|-S 16777216 -C 1 -T v"
	"rings-8KiB-65537B|-S 65537 -C 10 -B 4096 -T v"
)
if want rstream; then
	for c in "${RSTREAM_CASES[@]}"; do
		IFS='|' read -r name args gsextra <<<"$c"
		next_port
		id="rstream-gs-server-$name"
		run_pair "$id" 180 'listening' "$GSR -b $A -p $PORT $args $gsextra" "rstream -s $A -p $PORT $args"
		verdict_pair "$id"
		[[ -n $gsextra ]] && N+="gpusock side with $gsextra (waits for rstream's close: rstream -T a fails on a POLLHUP that arrives with unread data, a race against any fast peer); "
		grep -q '^custom' "$LOGS/$id.cli" || { V=FAIL; N+="rstream printed no result; "; }
		record rstream "rstream" gs-server "$name" $V "$DT" "${N}rstream $args: $(grep '^custom' "$LOGS/$id.cli" | oneline 120); $(last_line "$LOGS/$id.srv")" "$PKTS"

		next_port
		id="rstream-gs-client-$name"
		run_pair "$id" 180 '^name' "stdbuf -oL rstream -b $A -p $PORT $args" "$GSR -s $A -p $PORT $args"
		verdict_pair "$id"
		grep -q '^custom' "$LOGS/$id.srv" || { V=FAIL; N+="rstream printed no result; "; }
		record rstream "rstream" gs-client "$name" $V "$DT" "${N}rstream $args: $(grep '^custom' "$LOGS/$id.srv" | oneline 120); $(last_line "$LOGS/$id.cli")" "$PKTS"

		# Baseline without gpusock: rstream against rstream, same arguments.
		next_port
		id="rstream-baseline-$name"
		run_pair "$id" 180 '^name' "stdbuf -oL rstream -b $A -p $PORT $args" "rstream -s $A -p $PORT $args"
		verdict_pair "$id"
		grep -q '^custom' "$LOGS/$id.cli" || { V=FAIL; N+="rstream printed no result; "; }
		record rstream "rstream" baseline "$name" $V "$DT" "${N}rstream $args: $(grep '^custom' "$LOGS/$id.cli" | oneline 120)" "$PKTS"
	done
fi

# ------------------------------------------------------------- riostream
# riostream needs riomap(): its peer must advertise an iomap table. gpusock
# advertises iomap size 0 (iomap is not implemented), so riostream's riomap()
# fails with ENOMEM before any data moves. Checked to fail exactly that way,
# with gpusock's side seeing a clean end of the connection.
if want riostream; then
	for role in gs-server gs-client; do
		next_port
		id="riostream-$role"
		if [[ $role == gs-server ]]; then
			run_pair "$id" 60 'listening' "$GSR -b $A -p $PORT -S 4096 -C 10 -T v" "riostream -s $A -p $PORT -S 4096 -C 10 -T v"
			rio=$LOGS/$id.cli gs=$LOGS/$id.srv
		else
			run_pair "$id" 60 '^name' "stdbuf -oL riostream -b $A -p $PORT -S 4096 -C 10 -T v" "$GSR -s $A -p $PORT -S 4096 -C 10 -T v"
			rio=$LOGS/$id.srv gs=$LOGS/$id.cli
		fi
		if grep -q 'riomap: Cannot allocate memory' "$rio" && ((SRV_RC != 124 && CLI_RC != 124)) &&
			grep -Eq 'FAIL gs_rstream .*(peer closed early|ECONNRESET|EPIPE)' "$gs"; then
			V=NS N="not supported: iomap not implemented (gpusock advertises iomap size 0, so riostream's riomap() fails with ENOMEM by design); gpusock saw the connection end cleanly: $(last_line "$gs")"
		else
			V=FAIL N="unexpected: riostream: $(oneline <"$rio" 200); gpusock: $(last_line "$gs"); exits $SRV_RC/$CLI_RC"
		fi
		record riostream "riostream" "$role" "riomap/riowrite 4 KiB" $V "$DT" "$N" "$PKTS"
	done
fi

# ------------------------------------------------------------- rsocket API
# rdma-core 44's own rsocket library (librdmacm, unmodified) driven by the same
# conversation program as gpusock's side (xfer_peer.cc built twice).
XFER_CASES=(
	"size-1B|size --size 1"
	"size-2047B|size --size 2047"
	"size-2048B|size --size 2048"
	"size-65535B|size --size 65535"
	"size-65536B|size --size 65536"
	"size-65537B|size --size 65537"
	"size-1MiB|size --size 1048576"
	"size-16MiB|size --size 16777216"
	"halfclose-client-first|halfclose-c2s --size 300000 --reply 200000"
	"halfclose-server-first|halfclose-s2c --size 300000 --reply 200000"
	"close-by-client|close-client --size 300000"
	"close-by-server|close-server --size 300000"
	"seq-25-connections|seq --conns 25"
	"poll-after-peer-close|pollhup --size 60000"
)
if want rsocket; then
	for c in "${XFER_CASES[@]}"; do
		name=${c%%|*} args=${c#*|}
		for role in gs-server gs-client baseline; do
			case $role in gs-server) srvb=$GSX clib=$RSX ;; gs-client) srvb=$RSX clib=$GSX ;; *) srvb=$RSX clib=$RSX ;; esac
			next_port
			id="rsocket-$role-$name"
			run_pair "$id" 75 '' "$srvb server $args --addr $A --port $PORT --deadline 60" "$clib client $args --addr $A --port $PORT --deadline 60"
			verdict_pair "$id"
			record rsocket "rsocket API (librdmacm)" "$role" "$name" $V "$DT" "${N}server: $(last_line "$LOGS/$id.srv"); client: $(last_line "$LOGS/$id.cli")" "$PKTS"
		done
	done
	# Abort from each side: SIGKILL one side mid-stream; the survivor must see
	# EOF or an error promptly (the kernel tears the dead side's QP and
	# connection down).
	for victim in client server; do
		base_rc=
		for role in baseline gs-server gs-client; do
			case $role in gs-server) srvb=$GSX clib=$RSX ;; gs-client) srvb=$RSX clib=$GSX ;; *) srvb=$RSX clib=$RSX ;; esac
			next_port
			id="rsocket-$role-kill-$victim"
			ready=$SCR/$id.ready
			if [[ $victim == client ]]; then scase=sink ccase=blast; else scase=blast ccase=sink; fi
			p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
			t0=$(now)
			printf 'server: %s\nclient: %s\n' "$srvb server $scase" "$clib client $ccase" >"$LOGS/$id.cmd"
			start_bg "$LOGS/$id.srv" 90 "$srvb server $scase --addr $A --port $PORT --ready $ready"; spid=$BG_PID
			nap 0.3
			start_bg "$LOGS/$id.cli" 90 "$clib client $ccase --addr $A --port $PORT --ready $ready"; cpid=$BG_PID
			end=$((SECONDS + 30))
			while [[ ! -e $ready ]] && ((SECONDS < end)); do nap 0.05; done
			ss_snapshot "$id" "$PORT" streaming
			if [[ $victim == client ]]; then dead=$cpid live=$spid livelog=$LOGS/$id.srv; else dead=$spid live=$cpid livelog=$LOGS/$id.cli; fi
			tk=$(now)
			kill -KILL -- "-$dead" 2>/dev/null
			wait "$dead" 2>/dev/null
			wait_pid "$live" 8
			lrc=$WAIT_RC
			notice=$(since "$tk")
			DT=$(since "$t0")
			PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
			V=PASS N=
			[[ -e $ready ]] || { V=FAIL; N+="data never flowed (1 MiB); "; }
			((lrc == 0)) || { V=FAIL; N+="survivor exit $lrc (124 = it never noticed); "; }
			tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket seen; "; }
			case $role/$victim in
			gs-server/client | gs-client/server) who="rsocket killed, gpusock survives" ;;
			gs-server/server | gs-client/client) who="gpusock killed, rsocket survives" ;;
			*) who="rsocket killed, rsocket survives" ;;
			esac
			[[ $role == baseline ]] && base_rc=$lrc
			if [[ $V == FAIL && $role == baseline && $lrc == 124 ]]; then
				V=NS N="rdma-core 44 limitation (no gpusock involved): the surviving rsocket, connected with a blocking rconnect, never noticed its peer's death within 8 s, not even through idle 1-byte probe writes; "
			fi
			if [[ $V == FAIL && $who == "gpusock killed, rsocket survives" && $lrc == 124 && $base_rc == 124 ]]; then
				# Nothing a SIGKILLed process can do: the kernel tears its connection
				# down; whether the rsocket survivor notices is rdma-core's business,
				# and it fails the same way against a killed rsocket (baseline).
				V=NS N="rdma-core 44 limitation, same as the rsocket-vs-rsocket baseline: this rsocket (connected with a blocking rconnect) never noticed its peer's death within 8 s, not even through idle 1-byte probe writes; "
			fi
			record rsocket "rsocket API (librdmacm)" "$role" "kill-$victim" $V "$DT" "${N}$who; survivor noticed in ${notice}s: $(last_line "$livelog")" "$PKTS"
		done
	done
fi

# memc_roundtrip CLIENT-PRELOAD ID SIZE...: for each size, memccp a random
# value, memccat it back (byte-exact), memcrm it, confirm the miss. Uses S
# (--servers=...); adds to V/N.
memc_roundtrip() {
	local pre=$1 id=$2 n f
	shift 2
	for n in "$@"; do
		f=$SCR/val$n
		head -c "$n" /dev/urandom >"$f"
		if ! timeout 60 bash -c "$pre memccp $S $f" >>"$LOGS/$id.cli" 2>&1; then V=FAIL; N+="memccp $n failed; "; continue; fi
		timeout 60 bash -c "$pre memccat $S val$n" >"$SCR/got$n" 2>>"$LOGS/$id.cli"
		# memccat prints the value followed by a newline.
		if [[ $(stat -c %s "$SCR/got$n") != $((n + 1)) ]] || ! cmp -s -n "$n" "$f" "$SCR/got$n"; then
			V=FAIL; N+="memccat $n returned other bytes; "
		fi
		timeout 60 bash -c "$pre memcrm $S val$n" >>"$LOGS/$id.cli" 2>&1 || { V=FAIL; N+="memcrm $n failed; "; }
		if timeout 60 bash -c "$pre memccat $S val$n" >/dev/null 2>>"$LOGS/$id.cli"; then V=FAIL; N+="val$n still there after memcrm; "; fi
	done
}

# ------------------------------------------------------------- memcached
if want memcached; then
	MC_SIZES=1,2047,2048,65535,65536,65537,1048576
	# gpusock client → unmodified memcached 1.6.18 under librspreload (+ the
	# rdma-core 44 workaround preload, see rs44_workaround.c).
	next_port
	id=memcached-gs-client
	p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
	t0=$(now)
	mcmd="$PRELOAD memcached -u root -l $A -p $PORT -U 0 -t 2 -I 2m -m 64 -vv"
	printf 'server: %s\n' "$mcmd" >"$LOGS/$id.cmd"
	start_bg "$LOGS/$id.srv" 120 "$mcmd"; spid=$BG_PID
	wait_line "$LOGS/$id.srv" 'server listening' 20 "$spid"
	tcp_snapshot "$id" "$PORT" listening
	(nap 1; ss_snapshot "$id" "$PORT" mid-run) &
	mid=$!
	# A plain kernel-TCP client must find nobody: memcached listens via rdma_cm only.
	if timeout 3 bash -c "exec 3<>/dev/tcp/$A/$PORT" 2>/dev/null; then tcp_refused=no; else tcp_refused=yes; fi
	timeout -k 3 120 "$GSM" client --addr "$A" --port "$PORT" --sizes "$MC_SIZES" --small 50 >"$LOGS/$id.cli" 2>&1
	CLI_RC=$?
	wait "$mid"
	stop_bg "$spid" # memcached under librspreload ignores SIGTERM (lab notes): group KILL
	DT=$(since "$t0")
	PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
	V=PASS N=
	((CLI_RC == 0)) || { V=FAIL; N+="client exit $CLI_RC: $(grep FAIL "$LOGS/$id.cli" | head -n 1); "; }
	((PKTS > 0)) || { V=FAIL; N+="no rxe0 packets; "; }
	tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket on the memcached port; "; }
	[[ $tcp_refused == yes ]] || { V=FAIL; N+="a plain TCP client could connect; "; }
	record memcached "memcached 1.6.18 + librspreload" gs-client "set/get/delete 1 B..1 MiB" $V "$DT" \
		"${N}$(grep -c '^OK set/get/delete' "$LOGS/$id.cli") sizes ($MC_SIZES) set/get/delete/miss verified + 50-key multi-get; memcached saw $(grep -c '^<[0-9]* set' "$LOGS/$id.srv") sets; plain TCP connect refused: $tcp_refused" "$PKTS"

	# libmemcached's tools (unmodified, under librspreload + workaround) →
	# gpusock's minimal memcached.
	next_port
	id=memcached-gs-server
	p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
	t0=$(now)
	start_bg "$LOGS/$id.srv" 120 "$GSM server --addr $A --port $PORT"; spid=$BG_PID
	wait_line "$LOGS/$id.srv" 'listening' 20 "$spid"
	tcp_snapshot "$id" "$PORT" listening
	V=PASS N=
	S="--servers=$A:$PORT"
	memc_roundtrip "$PRELOAD" "$id" 1 1048576
	ver=$(timeout 30 bash -c "$PRELOAD memcstat $S" 2>&1 | awk '/version:/ { print $2 }')
	[[ $ver == *gs-memcache* ]] || { V=FAIL; N+="memcstat did not reach the gpusock server (version '$ver'); "; }
	tcp_snapshot "$id" "$PORT" after
	stop_bg "$spid"
	DT=$(since "$t0")
	PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
	((PKTS > 0)) || { V=FAIL; N+="no rxe0 packets; "; }
	tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket seen; "; }
	record memcached "libmemcached-tools + librspreload" gs-server "memccp/memccat/memcrm 1 B..1 MiB" $V "$DT" \
		"${N}values of 1 and 1048576 B stored, read back byte-exact (cmp), removed, miss confirmed; memcstat version $ver; $(tail -n 1 "$LOGS/$id.srv")" "$PKTS"
fi

# ------------------------------------------------------------- shim
# gpusock's preload shim (libgpusock_preload.so, verbs) against rdma-core 44's
# librspreload.so, both running unmodified Debian programs: memcached under
# one shim, libmemcached-tools under the other, and both under librspreload
# as the baseline. memcached under gpusock's shim runs as it is (libevent's
# epoll loop, SOCK_NONBLOCK sockets, accept4); under librspreload it needs the
# rdma-core 44 workarounds (PRELOAD above).
GS_SHIM="GPUSOCK_LOG=info LD_PRELOAD=$GSP"
# slap_case ROLE ID CONNECTIONS CLIENT-PRELOAD T0: memcslap set then get.
# Where the baseline (librspreload on both sides) fails the same load (rdma-core
# 44: memcslap's 4 threads under librspreload crash or time out), a failure of
# a role with librspreload on one side is reported as n/s, with both reasons.
declare -A SLAP_BASELINE=()
# slap_run LOG SECONDS SHELL-CMD: runs a memcslap; sets SLAP_RC. Once
# libmemcached has reported a fatal error the run has failed, and memcslap's
# other threads would only wait out the bound, so it is stopped (rc 125).
slap_run() {
	local pid
	start_bg "$1" "$2" "$3"; pid=$BG_PID
	while kill -0 "$pid" 2>/dev/null; do
		if grep -q 'Fatal error' "$1" 2>/dev/null; then
			stop_bg "$pid"
			SLAP_RC=125
			return
		fi
		nap 0.2
	done
	wait "$pid"
	SLAP_RC=$?
}
slap_case() {
	local role=$1 id=$2 c=$3 cpre=$4 t1=$5 f rc V=PASS N=
	for f in set get; do
		slap_run "$LOGS/$id.slap$c-$f" $((c == 1 ? 120 : 20)) "$cpre memcslap -s $A:$PORT -c $c -e 500 -t $f"
		rc=$SLAP_RC
		((rc == 0)) && grep -q "Time to $f" "$LOGS/$id.slap$c-$f" || { V=FAIL; N+="memcslap -c $c -t $f exit $rc $(grep -m1 -E 'error|Fatal' "$LOGS/$id.slap$c-$f" | oneline 120); "; }
	done
	[[ $role == baseline ]] && SLAP_BASELINE[$c]=$V
	if [[ $V == FAIL && $role == baseline ]]; then
		V=NS N="rdma-core 44 fails this load on its own (librspreload on both sides): $N"
	elif [[ $V == FAIL && ${SLAP_BASELINE[$c]:-} == FAIL ]]; then
		V=NS N="the rdma-core 44 side fails this load without gpusock too (baseline); here: $N"
	fi
	record shim "memcached ↔ libmemcached-tools" "$role" "memcslap set/get, $c connection$([[ $c == 1 ]] || echo s)" $V "$(since "$t1")" \
		"${N}$(grep -h 'Time to' "$LOGS/$id.slap$c"-* | oneline 200)" ""
}
# shim_case ROLE SERVER-PRELOAD CLIENT-PRELOAD
shim_case() {
	local role=$1 spre=$2 cpre=$3 id p0 t0 spid S f n rc V N
	next_port
	id=shim-$role
	S="--servers=$A:$PORT"
	p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
	t0=$(now)
	printf 'server: %s memcached ...\nclients: %s memc*\n' "$spre" "$cpre" >"$LOGS/$id.cmd"
	start_bg "$LOGS/$id.srv" 300 "$spre memcached -u root -l $A -p $PORT -U 0 -t 2 -I 2m -m 64 -c 256 -vv"; spid=$BG_PID
	wait_line "$LOGS/$id.srv" 'server listening|listening on .* via gpusock' 30 "$spid" || nap 2
	tcp_snapshot "$id" "$PORT" listening

	# memccapable: libmemcached's protocol conformance checks.
	V=PASS N=
	timeout -k 3 180 bash -c "$cpre memccapable -h $A -p $PORT -t 20" >"$LOGS/$id.capable" 2>&1
	rc=$?
	((rc == 0)) && grep -q 'All tests passed' "$LOGS/$id.capable" || { V=FAIL; N+="memccapable exit $rc: $(grep -m2 -iE 'fail|error' "$LOGS/$id.capable" | oneline 160); "; }
	record shim "memcached ↔ libmemcached-tools" "$role" "memccapable (all checks)" $V "$(since "$t0")" \
		"${N}$(grep -cE '\[pass\]|\[ok\]' "$LOGS/$id.capable") checks passed, $(grep -ciE '\[(fail|skip)' "$LOGS/$id.capable") failed/skipped; $(tail -n 1 "$LOGS/$id.capable")" ""

	# memcslap: a bounded load on one connection.
	local t1
	t1=$(now)
	slap_case "$role" "$id" 1 "$cpre" "$t1"

	# memccp / memccat / memcrm: values byte-exact, 1 B .. 1 MiB.
	t1=$(now)
	V=PASS N=
	memc_roundtrip "$cpre" "$id" 1 2047 65537 1048576
	record shim "memcached ↔ libmemcached-tools" "$role" "memccp/memccat/memcrm 1 B..1 MiB" $V "$(since "$t1")" \
		"${N}values of 1, 2047, 65537 and 1048576 B stored, read back byte-exact (cmp), removed, miss confirmed" ""

	# The same load on 4 connections at once, last (it is the one load rdma-core
	# 44's memcached under librspreload does not survive with its own clients).
	t1=$(now)
	slap_case "$role" "$id" 4 "$cpre" "$t1"

	tcp_snapshot "$id" "$PORT" after
	local pk=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
	# Which shim carried which side: gpusock's shim logs every socket it takes.
	local gs_srv gs_cli
	gs_srv=$(grep -c "via gpusock" "$LOGS/$id.srv")
	gs_cli=$(cat "$LOGS/$id.capable" "$LOGS/$id".slap* "$LOGS/$id.cli" | grep -c "via gpusock")

	# SIGTERM: the kernel's behaviour is that memcached exits at once.
	t1=$(now)
	kill -TERM -- "-$spid" 2>/dev/null
	local stopped=no ms
	for _ in {1..40}; do kill -0 "$spid" 2>/dev/null || { stopped=yes; break; }; nap 0.05; done
	ms=$((($(now) - t1) / 1000))
	stop_bg "$spid"
	V=PASS N=
	((pk > 0)) || { V=FAIL; N+="no rxe0 packets; "; }
	tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket on the memcached port; "; }
	if [[ $role == gs-server ]]; then
		((gs_srv > 0)) || { V=FAIL; N+="memcached's listener did not go through gpusock; "; }
	elif [[ $role == gs-client ]]; then
		((gs_cli > 0)) || { V=FAIL; N+="the tools' connections did not go through gpusock; "; }
	fi
	record shim "memcached ↔ libmemcached-tools" "$role" "over verbs (rxe0), no kernel TCP" $V "$(since "$t0")" \
		"${N}rxe0 packets $pk; gpusock shim lines: server $gs_srv, clients $gs_cli" "$pk"
	if [[ $stopped == yes ]]; then
		V=PASS N="memcached exited ${ms} ms after SIGTERM"
	elif [[ $spre == *gpusock* ]]; then
		V=FAIL N="memcached under gpusock's shim still ran 2 s after SIGTERM"
	else
		V=NS N="memcached under librspreload 44 ignores SIGTERM (rdma-core 44 behaviour; stopped with SIGKILL)"
	fi
	record shim "memcached ↔ libmemcached-tools" "$role" "SIGTERM stops memcached" $V "$(since "$t1")" "$N" ""
}
if want shim; then
	shim_case baseline "$PRELOAD" "$PRELOAD"   # rdma-core's shim on both sides (first: see slap_case)
	shim_case gs-server "$GS_SHIM" "$PRELOAD"  # memcached on gpusock's shim, tools on librspreload
	shim_case gs-client "$PRELOAD" "$GS_SHIM"  # memcached on librspreload, tools on gpusock's shim
fi

# ------------------------------------------------------------- prefork
# A pre-fork server under gpusock's shim over verbs (prefork_probe: a master
# that never accepts, three workers waiting on the inherited listener with
# epoll), its clients under rdma-core 44's librspreload. rdma_cm cannot share
# a listening port between processes: one worker holds it and serves every
# connection, the others say so once and wait (docs/preload.md). Checked:
# every connection byte-exact, served by a worker (no byte relayed through
# the master), over rxe0, no kernel TCP socket.
PREFORK=$BIN/preload/tests/prefork_probe
prefork_case() {
	local id=prefork t0 p0 spid rc V=PASS N= pk held workers
	next_port
	p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
	t0=$(now)
	start_bg "$LOGS/$id.srv" 120 "PREFORK_ADDR=$A EXPECT_GPUSOCK=1 $GS_SHIM $PREFORK server epoll $PORT 24 3"; spid=$BG_PID
	wait_line "$LOGS/$id.srv" 'listening on .* in this process' 30 "$spid" || nap 2
	tcp_snapshot "$id" "$PORT" listening
	timeout -k 3 90 bash -c "PREFORK_ADDR=$A PREFORK_CLIENT_THREADS=1 $PRELOAD $PREFORK client $PORT 24 16384" >"$LOGS/$id.cli" 2>&1
	rc=$?
	wait_pid "$spid" 30
	((rc == 0)) || { V=FAIL; N+="clients exit $rc: $(grep -m2 -E 'FAIL|client:' "$LOGS/$id.cli" | oneline 160); "; }
	grep -q '^FAIL' "$LOGS/$id.srv" && { V=FAIL; N+="server: $(grep -m2 '^FAIL' "$LOGS/$id.srv" | oneline 160); "; }
	grep -q 'the workers served all 24' "$LOGS/$id.srv" || { V=FAIL; N+="the master did not count 24 served; "; }
	tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket on the port; "; }
	pk=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
	held=$(grep -c 'is held by another process' "$LOGS/$id.srv")
	workers=$(grep -m1 -o 'served by [0-9]* process(es)' "$LOGS/$id.cli")
	record prefork "pre-fork server ↔ librspreload clients" gs-server "3 workers (epoll), 24 connections byte-exact" $V \
		"$(since "$t0")" "${N}${workers:-?}; workers that waited for the port (said once each): $held; rxe0 packets $pk" "$pk"
}
if want prefork; then
	if [[ -x $PREFORK ]]; then prefork_case; else record prefork "pre-fork server" gs-server "prefork_probe" FAIL 0 "missing $PREFORK" ""; fi
fi

# ------------------------------------------------------------- GPU echo server
# gpu/examples/gpu_echo_server on the host backend (the device code of the
# GPU sockets library run by emulated blocks; no GPU in the guest), over
# verbs, serving unmodified rstream and a plain-sockets client under
# librspreload. One server for the whole section; at the end its count of
# echoed bytes must equal what the clients sent.
GPU_RSTREAM_CASES=(
	"latency-1B|-S 1 -C 1 -I 100|100"
	"latency-64B|-S 64 -C 1 -I 100|6400"
	"latency-2KiB|-S 2048 -C 1 -I 100|204800"
	"latency-65537B|-S 65537 -C 1 -I 10|655370"
	"latency-256KiB|-S 262144 -C 1 -I 4|1048576"
	"bandwidth-4KiB-x64|-S 4096 -C 64 -I 2|524288"
	"bandwidth-64KiB-x4|-S 65536 -C 4 -I 2|524288"
	"blocking-async-2KiB|-S 2048 -C 1 -I 50 -T a|102400"
)
if want gpu; then
	next_port
	GPORT=$PORT
	gid=gpu-server
	start_bg "$LOGS/$gid.srv" 900 "GPUSOCK_LOG=info exec $GES --host-backend --port $GPORT --blocks 2 --threads 2 --conns 4"; gpid=$BG_PID
	wait_line "$LOGS/$gid.srv" 'listening on port' 60 "$gpid"
	expected=0
	for c in "${GPU_RSTREAM_CASES[@]}"; do
		IFS='|' read -r name args bytes <<<"$c"
		id="gpu-rstream-$name"
		p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
		t0=$(now)
		tcp_snapshot "$id" "$GPORT" before
		timeout -k 3 120 rstream -s "$A" -p "$GPORT" $args -T v >"$LOGS/$id.cli" 2>&1
		rc=$?
		tcp_snapshot "$id" "$GPORT" after
		PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
		V=PASS N=
		((rc == 0)) || { V=FAIL; N+="rstream exit $rc: $(tail -n 2 "$LOGS/$id.cli" | oneline 120); "; }
		grep -q '^custom' "$LOGS/$id.cli" || { V=FAIL; N+="rstream printed no result; "; }
		((PKTS > 0)) || { V=FAIL; N+="no rxe0 packets; "; }
		tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket on the port; "; }
		expected=$((expected + bytes + 16)) # + rstream's 16-byte sync exchange
		record gpu "rstream (unmodified)" gs-server "$name" $V "$(since "$t0")" \
			"${N}rstream $args -T v (rstream verifies every byte it gets back): $(grep '^custom' "$LOGS/$id.cli" | oneline 120)" "$PKTS"
	done
	# A plain-sockets program (libc only) under librspreload.
	PLAIN_ARGS="--sizes 1,64,2048,65537 --iters 20 --bulk 4194304"
	id=gpu-plain-rspreload
	p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
	t0=$(now)
	timeout -k 3 180 bash -c "$PRELOAD $PLAIN $A $GPORT $PLAIN_ARGS" >"$LOGS/$id.cli" 2>&1
	rc=$?
	tcp_snapshot "$id" "$GPORT" after
	PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
	V=PASS N=
	((rc == 0)) || { V=FAIL; N+="client exit $rc: $(last_line "$LOGS/$id.cli"); "; }
	((PKTS > 0)) || { V=FAIL; N+="no rxe0 packets; "; }
	tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket on the port; "; }
	expected=$((expected + 20 * (1 + 64 + 2048 + 65537) + 4194304))
	record gpu "plain-sockets client + librspreload" gs-server "ping-pong 1 B..64 KiB + 4 MiB bulk" $V "$(since "$t0")" \
		"${N}$(last_line "$LOGS/$id.cli")" "$PKTS"
	# Stop the server: it must exit cleanly and have echoed exactly what was sent.
	t0=$(now)
	kill -TERM "$gpid" 2>/dev/null
	wait_pid "$gpid" 30
	echoed=$(sed -n 's/^gpu_echo_server: echoed \([0-9]*\) bytes.*/\1/p' "$LOGS/$gid.srv")
	V=PASS N=
	((WAIT_RC == 0)) || { V=FAIL; N+="server exit $WAIT_RC; "; }
	[[ $echoed == "$expected" ]] || { V=FAIL; N+="server echoed '${echoed}' bytes, clients sent $expected; "; }
	record gpu "gpu_echo_server (host backend)" gs-server "stops on SIGTERM, echoed = sent" $V "$(since "$t0")" \
		"${N}echoed $echoed bytes, clients sent $expected; $(grep -m1 'proxy: transport' "$LOGS/$gid.srv" | oneline 160)" ""
fi

# ------------------------------------------------------------- apps
# gpu/apps/face_verify's GPU-native server (host backend: no GPU in the guest)
# over verbs: unmodified memcached 1.6.18 under librspreload holds the
# reference features (loaded by fv_load under librspreload), the server's
# blocks fetch them over their own gpusock sockets, and fv_client (plain
# sockets) under librspreload sends faces and checks every reply against the
# CPU reference: verdicts and exact chi-square, misses answered "unknown".
if want apps; then
	FV_ARGS="--size 64 --identities 200"
	next_port
	MCP=$PORT
	next_port
	FVP=$PORT
	id=apps-face-verify
	p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
	t0=$(now)
	start_bg "$LOGS/$id.mc" 600 "$PRELOAD memcached -u root -l $A -p $MCP -U 0 -t 2 -m 64 -c 256 -vv"; mpid=$BG_PID
	wait_line "$LOGS/$id.mc" 'server listening' 20 "$mpid"
	V=PASS N=
	if ! timeout -k 3 120 bash -c "$PRELOAD $FVL --memcached $A:$MCP $FV_ARGS --threads 1" >"$LOGS/$id.load" 2>&1; then
		V=FAIL; N+="loader under librspreload failed: $(tail -n 1 "$LOGS/$id.load" | oneline 120); "
	fi
	start_bg "$LOGS/$id.srv" 600 "exec $FVS --host-backend --blocks 2 --threads 4 --conns 2 --port $FVP --memcached $A:$MCP"; spid=$BG_PID
	wait_line "$LOGS/$id.srv" 'listening on port' 90 "$spid"
	tcp_snapshot "$id" "$FVP" listening
	timeout -k 3 300 bash -c "$PRELOAD $FVC --server $A:$FVP --conns 2 --requests 60 $FV_ARGS --timeout-ms 60000" \
		>"$LOGS/$id.cli" 2>&1
	rc=$?
	tcp_snapshot "$id" "$FVP" after
	kill -TERM "$spid" 2>/dev/null
	wait_pid "$spid" 30
	stop_bg "$mpid" # memcached under librspreload ignores SIGTERM (lab notes)
	PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
	((rc == 0)) || { V=FAIL; N+="fv_client exit $rc: $(tail -n 2 "$LOGS/$id.cli" | oneline 160); "; }
	((WAIT_RC == 0)) || { V=FAIL; N+="server exit $WAIT_RC; "; }
	((PKTS > 0)) || { V=FAIL; N+="no rxe0 packets; "; }
	tcp_clean "$id" || { V=FAIL; N+="kernel TCP socket on the port; "; }
	record apps "fv_client + memcached, both under librspreload" gs-server "face verification, 60 requests 64x64, every reply checked" \
		$V "$(since "$t0")" "${N}$(grep -m1 -E 'replies|throughput' "$LOGS/$id.cli" | oneline 200)" "$PKTS"
fi

# ------------------------------------------------------------- hostile peers
# gs_hostile (wire/transport.h + wire/verbs + crafted wire/core records and
# immediates) attacks a gpusock echo server (gs_xfer_peer victim) while a
# well-behaved gpusock client keeps a conversation open on the same process.
HOSTILE_CASES=(
	"version2|reject|rejecting connection: connection record version is not 1"
	"short-record|reject|rejecting connection: connection record"
	"bad-advert|close|-> EPROTO"
	"credits-backwards|close|-> EPROTO"
	"credits-overflow|close|-> EPROTO"
	"write-past|close|-> EPROTO"
	"iomap-imm|close|-> EPROTO"
	"bad-rkey|close|-> EIO"
)
if want hostile; then
	next_port
	VPORT=$PORT
	vlog=$LOGS/hostile-victim.log
	: >"$vlog"
	start_bg "$LOGS/hostile-victim.stderr" 600 "GPUSOCK_LOG=info $GSX server victim --addr $A --port $VPORT --log $vlog"; vpid=$BG_PID
	wait_line "$vlog" 'listening' 20 "$vpid"
	if timeout 3 bash -c "exec 3<>/dev/tcp/$A/$VPORT" 2>/dev/null; then victim_tcp=no; else victim_tcp=yes; fi
	hold_ready=$SCR/hold.ready hold_until=$SCR/hold.until
	start_bg "$LOGS/hostile-hold.cli" 600 "$GSX client hold --addr $A --port $VPORT --ready $hold_ready --until $hold_until --max 500"; hpid=$BG_PID
	end=$((SECONDS + 30))
	while [[ ! -e $hold_ready ]] && ((SECONDS < end)); do nap 0.05; done
	for c in "${HOSTILE_CASES[@]}"; do
		IFS='|' read -r name kind expect <<<"$c"
		id="hostile-$name"
		p0=$(($(cnt sent_pkts) + $(cnt rcvd_pkts)))
		t0=$(now)
		voff=$(wc -l <"$vlog") eoff=$(wc -l <"$LOGS/hostile-victim.stderr")
		timeout -k 3 40 "$HOST" "$name" --addr "$A" --port "$VPORT" --wait 10 >"$LOGS/$id.cli" 2>&1
		hrc=$?
		nap 0.3
		tail -n +$((voff + 1)) "$vlog" >"$LOGS/$id.victim"
		tail -n +$((eoff + 1)) "$LOGS/hostile-victim.stderr" >>"$LOGS/$id.victim"
		# A fresh well-behaved connection right after the attack (4 KiB + 300 kB echo).
		touch "$SCR/$id.go"
		timeout -k 3 60 "$GSX" client hold --addr "$A" --port "$VPORT" --ready "$SCR/$id.r" --until "$SCR/$id.go" >"$LOGS/$id.fresh" 2>&1
		frc=$?
		ss_snapshot "$id" "$VPORT" after
		DT=$(since "$t0")
		PKTS=$(($(cnt sent_pkts) + $(cnt rcvd_pkts) - p0))
		V=PASS N=
		((hrc == 0)) || { V=FAIL; N+="hostile peer: exit $hrc; "; }
		grep -qF -- "$expect" "$LOGS/$id.victim" || { V=FAIL; N+="victim did not report '$expect'; "; }
		((frc == 0)) || { V=FAIL; N+="a fresh connection after the attack failed; "; }
		kill -0 "$vpid" 2>/dev/null || { V=FAIL; N+="VICTIM PROCESS DIED; "; }
		kill -0 "$hpid" 2>/dev/null || [[ -e $hold_until ]] || { V=FAIL; N+="the held connection ended early; "; }
		vline=$(grep -E 'closed after|rejecting' "$LOGS/$id.victim" | head -n 1 | sed 's/^gpusock\[[0-9]*\]: //')
		record hostile "gs_hostile (wire/verbs)" gs-server "$name" $V "$DT" "${N}$(last_line "$LOGS/$id.cli" | sed 's/^RESULT [A-Z]* [a-z0-9-]*: //') | victim: $vline" "$PKTS"
	done
	# Two things gpusock should also get right, checked on the same runs:
	# (1) the victim's own thread learns WHY (gs_last_error), not only errno;
	V=PASS N=
	for name in bad-advert credits-backwards credits-overflow write-past iomap-imm bad-rkey; do
		l=$(grep -m1 'closed after' "$LOGS/hostile-$name.victim" | sed -n 's/.*last_error="\(.*\)"$/\1/p')
		case $l in
		"") V=FAIL; N+="$name: empty; " ;;
		*credit*|*advert*|*past*|*iomap*|*boundary*|*RDMA*|*write*) N+="$name: \"$l\"; " ;;
		*) V=FAIL; N+="$name: unrelated \"$l\"; " ;;
		esac
	done
	record hostile "gs_hostile (wire/verbs)" gs-server "victim's gs_last_error names the violation" $V "-" "$N"
	# (2) the verbs transport tells a failed write from a flushed receive (the
	# hostile peer uses gpusock's own transport: after bad-rkey its QP is in
	# error and its ~130 posted receives are flushed).
	l=$(last_line "$LOGS/hostile-bad-rkey.cli")
	posted=$(sed -n 's/.*we posted \([0-9]*\) write.*/\1/p' <<<"$l")
	reported=$(sed -n 's/.*reported \([0-9]*\) write completion.*/\1/p' <<<"$l")
	unknown=$(sed -n 's/.* \([0-9]*\) with a token we never used.*/\1/p' <<<"$l")
	if [[ -n $posted && -n $reported && $reported -le $posted && ${unknown:-0} == 0 ]]; then V=PASS; else V=FAIL; fi
	record hostile "gs_hostile (wire/verbs)" gs-client "error completions classified (send vs receive)" $V "-" \
		"after bad-rkey put gs_hostile's QP in error: it had posted ${posted:-?} write(s); gpusock's verbs transport reported ${reported:-?} write completion(s), ${unknown:-?} of them with a token never posted (flushed receives taken for writes)"
	touch "$hold_until"
	wait_pid "$hpid" 60
	hrc=$WAIT_RC
	kill -0 "$vpid" 2>/dev/null && valive=yes || valive=no
	stop_bg "$vpid"
	if ((hrc == 0)) && [[ $valive == yes ]]; then V=PASS; else V=FAIL; fi
	record hostile "gs_hostile (wire/verbs)" gs-server "other connection unharmed" $V "-" \
		"victim process alive through all attacks: $valive; the connection held open throughout: $(last_line "$LOGS/hostile-hold.cli")"
	[[ $victim_tcp == yes ]] && V=PASS || V=FAIL
	record proof "kernel TCP" gs-server "plain TCP to a gpusock port" $V "-" "a kernel TCP connect to the gpusock victim's port $VPORT was refused: $victim_tcp"

	# The hostile peer as a server: a gpusock client meets a version-2 record.
	for sc in "serve-version2|EPROTONOSUPPORT|version" "serve-garbage|EPROTO,EPROTONOSUPPORT|not an rsocket"; do
		IFS='|' read -r name errs msg <<<"$sc"
		next_port
		id="hostile-$name"
		run_pair "$id" 60 'listening' "$HOST $name --addr $A --port $PORT --wait 10" \
			"$GSE connect $A $PORT --expect $errs --msg '$msg'"
		V=PASS N=
		((CLI_RC == 0)) || { V=FAIL; N+="gpusock's report was not clear; "; }
		((SRV_RC == 0)) || { V=FAIL; N+="hostile server: exit $SRV_RC; "; }
		record hostile "gs_hostile (wire/verbs)" gs-client "$name" $V "$DT" "${N}$(last_line "$LOGS/$id.cli" | sed 's/^RESULT [A-Z]* //') | hostile: $(last_line "$LOGS/$id.srv" | sed 's/^RESULT [A-Z]* [a-z0-9-]*: //')" "$PKTS"
	done
fi

# ------------------------------------------------------------- errors users hit
if want errors; then
	# What rdma-core 44's rsocket reports for the same connect (for comparison).
	rs_connect_err() { # ADDR PORT [SECONDS]
		local out rc
		out=$(timeout -k 2 "${3:-25}" "$RSX" client size --size 1 --retry 0 --addr "$1" --port "$2" 2>&1)
		rc=$?
		out=$(sed -n 's/.*connect: \(E[A-Z]*\).*/\1/p' <<<"$out" | head -n 1)
		if [[ -n $out ]]; then echo "$out"
		elif ((rc == 124)); then echo "connect succeeded, then the first send hung (no check of the peer's record)"
		else echo "exit $rc"; fi
	}
	errcase() { # CASE EXPECT MSG -- gs_errcheck ARGS...
		local name=$1 exp=$2 msg=$3 t0 rc base=
		shift 4
		t0=$(now)
		timeout -k 3 30 "$GSE" "$@" --expect "$exp" --msg "$msg" >"$LOGS/errors-$name.cli" 2>&1
		rc=$?
		if ((rc == 0)); then V=PASS; else V=FAIL; fi
		[[ $1 == connect ]] && base=" | rsocket 44 on the same connect: $(rs_connect_err "$2" "$3")"
		record errors "gpusock alone" gs-client "$name" $V "$(since "$t0")" "$(last_line "$LOGS/errors-$name.cli" | sed 's/^RESULT [A-Z]* //')$base"
	}
	GPUSOCK_VERBS_DEVICE=mlx5_9 errcase "no-verbs-device (GPUSOCK_VERBS_DEVICE=mlx5_9)" ENODEV "names no RDMA device" -- socket
	errcase "unresolvable: no route (192.0.2.1)" ENETUNREACH,EHOSTUNREACH "192.0.2.1|route|resolve|ENETUNREACH|EHOSTUNREACH" -- connect 192.0.2.1 7000
	errcase "unresolvable: no neighbour (10.0.2.99)" EHOSTUNREACH,ETIMEDOUT,ENETUNREACH "10.0.2.99|resolve|unreachable|timed out" -- connect 10.0.2.99 7000
	errcase "unresolvable: loopback (127.0.0.1)" ENODEV,EADDRNOTAVAIL,ENETUNREACH "127.0.0.1|device|loopback|resolve" -- connect 127.0.0.1 7000
	next_port
	errcase "refused: no listener" ECONNREFUSED "" -- connect "$A" "$PORT"

	# Peer is not an rsocket: rping (rdma-core's rdma_cm example, same RDMA_PS_TCP
	# port space, no rsocket record) as server, then as client.
	next_port
	id=errors-rping-server
	run_pair "$id" 60 '' "rping -s -a $A -p $PORT -C 1 -v" \
		"sleep 2; $GSE connect $A $PORT --expect EPROTO,EPROTONOSUPPORT,ECONNREFUSED --msg 'not an rsocket'"
	if ((CLI_RC == 0)); then V=PASS; else V=FAIL; fi
	gsnote="$(last_line "$LOGS/$id.cli" | sed 's/^RESULT [A-Z]* //') | rping: $(oneline <"$LOGS/$id.srv" 120)"
	# The same against rdma-core 44's rsocket, for comparison.
	next_port
	start_bg "$LOGS/$id.rsbase" 30 "rping -s -a $A -p $PORT -C 1"; bpid=$BG_PID
	sleep 2
	base=$(rs_connect_err "$A" "$PORT" 6)
	stop_bg "$bpid"
	record errors "rping (not an rsocket)" gs-client "peer is not an rsocket" $V "$DT" "$gsnote | rsocket 44 against rping: $base" "$PKTS"

	next_port
	id=errors-rping-client
	vlog=$LOGS/$id.victim
	: >"$vlog"
	t0=$(now)
	start_bg "$LOGS/$id.srv" 60 "GPUSOCK_LOG=info $GSX server victim --addr $A --port $PORT --log $vlog"; vpid=$BG_PID
	wait_line "$vlog" 'listening' 20 "$vpid"
	timeout -k 3 30 rping -c -a "$A" -p "$PORT" -C 1 -v >"$LOGS/$id.cli" 2>&1
	rrc=$?
	touch "$SCR/$id.go"
	timeout -k 3 60 "$GSX" client hold --addr "$A" --port "$PORT" --ready "$SCR/$id.r" --until "$SCR/$id.go" >"$LOGS/$id.fresh" 2>&1
	frc=$?
	stop_bg "$vpid"
	V=PASS N=
	((rrc != 0)) || { V=FAIL; N+="rping's connect succeeded; "; }
	grep -q 'rejecting connection' "$LOGS/$id.srv" || { V=FAIL; N+="gpusock did not log the reject; "; }
	((frc == 0)) || { V=FAIL; N+="gpusock server did not serve the next client; "; }
	record errors "rping (not an rsocket)" gs-server "peer is not an rsocket" $V "$(since "$t0")" \
		"${N}gpusock: $(grep -m1 'rejecting' "$LOGS/$id.srv" | sed 's/^gpusock\[[0-9]*\]: //'); rping: $(oneline <"$LOGS/$id.cli" 100); next client served: $([[ $frc == 0 ]] && echo yes || echo no)"
fi

# ------------------------------------------------------------- proof of verbs
if want proof; then
	S=$(($(cnt sent_pkts) - P_START_S)) R=$(($(cnt rcvd_pkts) - P_START_R))
	if ((S > 0 && R > 0)); then V=PASS; else V=FAIL; fi
	record proof "rxe0 counters" "-" "whole run" $V "$(since "$run_started")" \
		"rxe0 hw_counters over the run: sent_pkts +$S, rcvd_pkts +$R (every data case also checks its own delta > 0)"
	TCP_SNAPSHOTS=$(grep -c . "$SCR/tcp-snapshots") TCP_HITS=$(grep -c ' hit' "$SCR/tcp-snapshots")
	SS_SNAPSHOTS=$(grep -c -- '-ss$' "$SCR/tcp-snapshots")
	if ((TCP_HITS == 0 && TCP_SNAPSHOTS > 0 && SS_SNAPSHOTS > 0)); then V=PASS; else V=FAIL; fi
	record proof "kernel TCP" "-" "no TCP socket on test ports" $V "-" \
		"$TCP_SNAPSHOTS snapshots of the kernel's TCP sockets while servers listened and data flowed ($((TCP_SNAPSHOTS - SS_SNAPSHOTS)) reads of /proc/net/tcp{,6}, $SS_SNAPSHOTS runs of ss -tanp on the long cases, logs/*.ss): $TCP_HITS showed a TCP socket on the case's port"
fi

# Last, as it removes the device: gpusock with no verbs device at all.
if want errors; then
	rdma link delete rxe0 2>/dev/null
	for _ in {1..50}; do [[ -e /sys/class/infiniband/rxe0 ]] || break; nap 0.1; done
	errcase "no-verbs-device (rxe0 removed)" ENODEV "no RDMA device" -- socket
fi

echo "run-matrix: done in $(since "$run_started")s"
! grep -q $'\tFAIL\t' "$RES"
