#!/usr/bin/env bash
# scripts/testnet: hosts with their own addresses and names, a per-host
# bandwidth limit that holds, bad input refused, and nothing left behind by
# `down` or by a test that was killed.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/net_lib.sh"

net_up 3 0.2
name=$PSTRAIN_TESTNET
[ "$("$TESTNET" hosts | tr '\n' ' ')" = "h0 10.88.0.1 h1 10.88.0.2 h2 10.88.0.3 " ] ||
  fail "hosts: $("$TESTNET" hosts)"
[ "$(on h1 ip -4 -o addr show dev eth0 | awk '{print $4}')" = "10.88.0.2/24" ] || fail "h1's address"
[ "$(on 0 getent hosts h2 | awk '{print $1}')" = "10.88.0.3" ] || fail "h2 does not resolve on h0"
ip -4 -o addr | grep -q ' 10\.88\.0\.' && fail "the machine's own namespace got a 10.88.0.x address"

# The token bucket holds each host to 0.2 Gbit/s (measured ~0.19).
start iperf on h1 iperf3 -s -1 -B 10.88.0.2
sleep 0.5
gbps=$(on h0 iperf3 -c h1 -t 2 -J | "$PY" -c 'import json,sys
print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))')
awk -v g="$gbps" 'BEGIN{exit !(g >= 0.1 && g <= 0.21)}' || fail "h0 -> h1 at $gbps Gbit/s, limit 0.2"
wait_for "$LAST_PID" 10 || fail "iperf3 server did not finish"

expect_exit 2 "no host 'h7'" -- "$TESTNET" run h7 -- true
expect_exit 2 "N must be 1..200" -- "$TESTNET" up 0
expect_exit 2 "--gbit 'fast'" -- "$TESTNET" up 2 --gbit fast
expect_exit 2 "no testnet 'pstn00000000'" -- "$TESTNET" --net pstn00000000 down
if ! modinfo sch_netem >/dev/null 2>&1 && ! grep -q netem /proc/modules 2>/dev/null; then
  expect_exit 2 "no netem" -- "$TESTNET" up 2 --delay-ms 5
fi

# down stops what runs inside and removes every namespace and file.
start sleeper on h1 sleep 300
sleeper=$LAST_PID
sleep 0.3
net_down
kill -0 "$sleeper" 2>/dev/null && fail "a process inside h1 outlived down"
[ -z "$(ip netns list | grep "^$name")" ] || fail "namespaces left: $(ip netns list | grep "^$name")"
[ ! -e "/etc/netns/$name-h0" ] && [ ! -e "/run/pstrain-testnet/$name" ] || fail "files left after down"

# A test killed with SIGKILL leaves its net; gc removes it once the owner is gone.
bash -c "eval \"\$('$TESTNET' up 2 --owner \$\$)\"; echo \$PSTRAIN_TESTNET >'$SCRATCH/killed'; exec sleep 300" &
owner=$!
for _ in $(seq 100); do [ -s "$SCRATCH/killed" ] && break; sleep 0.1; done
killed=$(cat "$SCRATCH/killed")
[ -n "$(ip netns list | grep "^$killed-h1")" ] || fail "the killed test's net was not made"
kill -9 "$owner"
wait "$owner" 2>/dev/null
"$TESTNET" gc 2>/dev/null
[ -z "$(ip netns list | grep "^$killed")" ] || fail "gc left $killed's namespaces"
finish
