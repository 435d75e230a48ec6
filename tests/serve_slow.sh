#!/usr/bin/env bash
# tlm serve under a slow-client attack: 1,000 connections that send their headers and then a body
# a byte at a time. /health and a short completion must still answer within a second, the
# server's memory must stay bounded while they are open, and --timeout must close them.
. "$(dirname "$0")/lib.sh"
M=$DATA/models/stories260K.gguf
need "$M"

"$TLM" serve -m "$M" --port 0 -t 1 --timeout 4 >"$TMP/serve.out" 2>"$TMP/serve.err" &
PID=$!
T_PIDS+=("$PID")
listening() { URL=$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$TMP/serve.out"); [ -n "$URL" ]; }
wait_until 10 listening || { cat "$TMP/serve.err" >&2; die "the server did not start"; }
PORT=${URL##*:}

# The attack and the checks in one process: it opens the connections, keeps them dripping, times
# the two requests, reads the server's resident memory, then waits past --timeout and counts the
# connections the server closed. Prints one JSON line.
/usr/bin/python3 - "$PORT" "$PID" 1000 >"$TMP/result.json" 2>"$TMP/attack.err" <<'PY'
import json, socket, sys, threading, time, urllib.request
port, pid, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{")
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(head)
    socks.append(s)
stop = threading.Event()
def drip():
    while not stop.is_set():
        for s in socks:
            try:
                s.send(b" ")
            except OSError:
                pass
        stop.wait(0.3)
threading.Thread(target=drip, daemon=True).start()
time.sleep(1)
def timed(req):
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body, code = r.read(), r.status
    except Exception as e:
        body, code = b"", str(e)
    return time.time() - t0, code, body.decode(errors="replace")
health = timed(f"http://127.0.0.1:{port}/health")
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                             data=json.dumps({"prompt": "Once upon", "max_tokens": 8,
                                              "temperature": 0}).encode(),
                             headers={"Content-Type": "application/json"})
completion = timed(req)
rss = 0
for line in open(f"/proc/{pid}/status"):
    if line.startswith("VmRSS:"):
        rss = int(line.split()[1]) // 1024
time.sleep(5)  # past --timeout 4
stop.set()
closed = 0
for s in socks:
    s.settimeout(2)
    try:
        closed += s.recv(1) == b""
    except OSError:
        closed += 1
print(json.dumps({"open": len(socks), "health_s": health[0], "health": health[1],
                  "completion_s": completion[0], "completion": completion[1],
                  "text": json.loads(completion[2])["choices"][0]["text"] if completion[1] == 200 else "",
                  "rss_mib": rss, "closed": closed}))
PY
[ -s "$TMP/result.json" ] || { cat "$TMP/attack.err" >&2; die "the attack script failed"; }
cat "$TMP/result.json"
r() { json_get "j[\"$1\"]" "$TMP/result.json"; }
expect "1000 slow connections open" [ "$(r open)" = 1000 ]
expect "/health answers 200 meanwhile" [ "$(r health)" = 200 ]
expect "/health within a second" awk -v t="$(r health_s)" 'BEGIN { exit !(t < 1) }'
expect "a completion answers 200 meanwhile" [ "$(r completion)" = 200 ]
expect "the completion within a second" awk -v t="$(r completion_s)" 'BEGIN { exit !(t < 1) }'
expect "the completion has text" [ -n "$(r text)" ]
# 1,000 connection threads with their request buffers: far below what unbounded bodies would take
expect "resident memory stays bounded (< 512 MiB)" [ "$(r rss_mib)" -lt 512 ]
expect "--timeout closed the slow connections" [ "$(r closed)" = 1000 ]
curl -s -o /dev/null -w '%{http_code}' "$URL/health" >"$TMP/after"
expect "the server still answers afterwards" [ "$(cat "$TMP/after")" = 200 ]
finish
