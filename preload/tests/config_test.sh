#!/usr/bin/env bash
# rsocket's configuration files (/etc/rdma/rsocket, here GPUSOCK_RSOCKET_CONF_DIR)
# become the defaults of every gpusock socket; GPUSOCK_* variables win over
# them; preload_config chooses which programs' sockets are taken.
#   config_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
P=$2
W=$GS_WORK
D=$W/rsocket
mkdir -p "$D"
echo 65536 >"$D/mem_default"
echo 32768 >"$D/wmem_default"
echo 64 >"$D/sqsize_default"
echo 96 >"$D/rqsize_default"
echo 32 >"$D/inline_default"
echo 0 >"$D/iomap_size"
export GPUSOCK_RSOCKET_CONF_DIR=$D
echo "== rsocket config files over $GPUSOCK_TRANSPORT"

env LD_PRELOAD="$PRELOAD" GPUSOCK_LOG=info timeout 30 "$PROBE" sockopts "$P" >"$W/files.out" 2>"$W/files.err"
cat "$W/files.out" "$W/files.err"
check "mem_default -> SO_RCVBUF 65536" grep -qx "SO_RCVBUF 65536" "$W/files.out"
check "wmem_default -> SO_SNDBUF 32768" grep -qx "SO_SNDBUF 32768" "$W/files.out"
check "sqsize_default -> RDMA_SQSIZE 64" grep -qx "SOL_RDMA 0 64" "$W/files.out"
check "rqsize_default -> RDMA_RQSIZE 96" grep -qx "SOL_RDMA 1 96" "$W/files.out"
check "inline_default -> RDMA_INLINE 32" grep -qx "SOL_RDMA 2 32" "$W/files.out"
check "iomap_size -> RDMA_IOMAPSIZE 0" grep -qx "SOL_RDMA 3 0" "$W/files.out"

env LD_PRELOAD="$PRELOAD" GPUSOCK_MEM_DEFAULT=262144 timeout 30 "$PROBE" sockopts $((P + 1)) >"$W/env.out" 2>&1
check "GPUSOCK_MEM_DEFAULT=262144 wins over mem_default" grep -qx "SO_RCVBUF 262144" "$W/env.out"
check "the other files still apply" grep -qx "SO_SNDBUF 32768" "$W/env.out"

printf '# program domain type protocol\nsome_other_program inet stream tcp\n' >"$D/preload_config"
env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=0 timeout 30 "$PROBE" epoll-mix $((P + 2)) >"$W/rules-out.out" 2>&1
check "preload_config without this program: its TCP sockets stay kernel" grep -q "ok: listener fd .* is a kernel socket" "$W/rules-out.out"
printf 'preload_pro inet stream tcp\n' >"$D/preload_config"
env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=1 timeout 30 "$PROBE" epoll-mix $((P + 4)) >"$W/rules-in.out" 2>&1
check "preload_config naming it (by prefix): gpusock" grep -q "ok: listener fd .* is a gpusock socket" "$W/rules-in.out"
finish
