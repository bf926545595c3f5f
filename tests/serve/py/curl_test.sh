#!/usr/bin/env bash
# curl against `cedar serve --scripted`: the wire as a shell user sees it (plain JSON, SSE, errors).
# Usage: curl_test.sh PATH/TO/cedar. Exit 77 (CTest: skipped) when curl is not installed.
set -uo pipefail
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
cedar="$1"
here="$(cd "$(dirname "$0")" && pwd)"
log="$(mktemp)"
"$cedar" serve --scripted "$here/sdk_script.json" --tokenizer "$here/../data/tokenizer" --port 0 \
  --api-key k --max-body-bytes 65536 --thinking off >"$log" 2>&1 &  # the script: chat-mode answers
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
url=""
for _ in $(seq 100); do
  url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -1)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "FAIL: server did not start"; cat "$log"; exit 1; }

failures=0
check() {  # check NAME EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then echo "ok   $1"; else echo "FAIL $1: expected [$2] got [$3]"; failures=$((failures + 1)); fi
}
post() {  # post PATH BODY -> prints "STATUS BODY"
  curl -sS -H "Authorization: Bearer k" -H "Content-Type: application/json" -o /tmp/cedar_curl_body.$$ \
    -w "%{http_code}" "$url$1" -d "$2"
}
json() { python3 -c "import json,sys; d=json.load(open('/tmp/cedar_curl_body.$$')); print($1)"; }

status=$(post /v1/chat/completions '{"model":"m","messages":[{"role":"user","content":"hi"}]}')
check "chat 200" 200 "$status"
check "chat content" "Hello from cedar!" "$(json "d['choices'][0]['message']['content']")"

status=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"What is the weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"stream":true}')
check "stream 200" 200 "$status"
check "stream ends with [DONE]" "data: [DONE]" "$(grep -v '^$' /tmp/cedar_curl_body.$$ | tail -1)"
check "stream has a tool call" 1 "$(grep -c '"name":"get_weather"' /tmp/cedar_curl_body.$$)"
check "stream has no DSML" 0 "$(grep -c 'DSML' /tmp/cedar_curl_body.$$)"

status=$(curl -sS -H "x-api-key: k" -H "Content-Type: application/json" -o /tmp/cedar_curl_body.$$ -w "%{http_code}" \
  "$url/v1/messages" -d '{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"stream":true}')
check "messages stream 200" 200 "$status"
check "messages stream ends" "event: message_stop" "$(grep '^event:' /tmp/cedar_curl_body.$$ | tail -1)"

status=$(post /v1/chat/completions '{"messages": [')
check "malformed JSON 400" 400 "$status"
check "malformed JSON error type" invalid_request_error "$(json "d['error']['type']")"
status=$(curl -sS -o /tmp/cedar_curl_body.$$ -w "%{http_code}" "$url/v1/models")
check "no key 401" 401 "$status"
status=$(post /v1/nothing '{}')
check "unknown route 404" 404 "$status"
big=$(python3 -c "import json; print(json.dumps({'messages':[{'role':'user','content':'x'*100000}]}))")
status=$(post /v1/chat/completions "$big")
check "oversize 413" 413 "$status"
status=$(curl -sS -o /dev/null -w "%{http_code}" "$url/health")
check "health 200" 200 "$status"
rm -f /tmp/cedar_curl_body.$$

kill -TERM $pid
wait $pid
check "clean exit on SIGTERM" 0 "$?"
[ "$failures" -eq 0 ] || { echo "$failures curl check(s) failed"; exit 1; }
echo "all curl checks passed"
