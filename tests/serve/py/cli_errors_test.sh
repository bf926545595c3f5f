#!/usr/bin/env bash
# The CLI's answers to bad input (issue 12): each must exit non-zero, say what is wrong and how to
# fix it, and never print a strerror of errno 0 ("Success").
# usage: cli_errors_test.sh path/to/cedar
set -u
CEDAR=$1
HERE=$(cd "$(dirname "$0")" && pwd)
SCRIPT=$HERE/sdk_script.json
TOK=$HERE/../data/tokenizer
failures=0

# expect NAME "PATTERN" -- command...: non-zero exit, PATTERN (grep -E) in the output, no "Success".
expect() {
  local name=$1 pattern=$2
  shift 3
  local out rc
  out=$(timeout 60 "$@" 2>&1 </dev/null)
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -qE -- "$pattern" <<<"$out" || grep -q "Success" <<<"$out"; then
    echo "FAIL $name (rc=$rc): expected /$pattern/, got:"
    echo "$out" | head -5
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

expect bad_host "'999\.1\.1\.1' is not a valid IP address" -- \
  "$CEDAR" serve --host 999.1.1.1 --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect missing_model "model folder '/nonexistent/cedar-model' does not exist" -- \
  "$CEDAR" serve -m /nonexistent/cedar-model
expect empty_api_key "--api-key is empty.*--api-key-file" -- \
  "$CEDAR" serve --api-key '' --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect empty_env_key "CEDAR_API_KEY is set but empty" -- \
  env CEDAR_API_KEY= "$CEDAR" serve --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect missing_key_file "--api-key-file '/nonexistent/key' cannot be read" -- \
  "$CEDAR" serve --api-key-file /nonexistent/key --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
# Keys no HTTP client can send would start a server that refuses everyone (issue 35): refused at start.
expect newline_api_key "--api-key contains the control character 0x0A \(a line break\)" -- \
  "$CEDAR" serve --api-key $'abc\ndef' --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect blank_api_key "--api-key is blank" -- \
  "$CEDAR" serve --api-key '   ' --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect bom_env_key "CEDAR_API_KEY starts with a UTF-8 byte-order mark" -- \
  env CEDAR_API_KEY=$'\xef\xbb\xbfsecret' "$CEDAR" serve --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
KEYFILE=$(mktemp)
trap 'rm -f "$KEYFILE"' EXIT
printf 'ab\001cd\n' >"$KEYFILE"
expect control_key_file "the key in --api-key-file .* contains the control character 0x01" -- \
  "$CEDAR" serve --api-key-file "$KEYFILE" --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
printf '\xef\xbb\xbf\r\n' >"$KEYFILE"  # a BOM is stripped (what editors add); nothing is left
expect bom_only_key_file "starts with an empty line" -- \
  "$CEDAR" serve --api-key-file "$KEYFILE" --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect max_tokens_over_tpm "--max-tokens \(5000\) must be below --max-tokens-per-minute-per-key \(1000\)" -- \
  "$CEDAR" serve --max-tokens 5000 --max-tokens-per-minute-per-key 1000 --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect body_budget_below_body "--max-body-bytes-in-flight must be 0 \(no limit\) or at least --max-body-bytes" -- \
  "$CEDAR" serve --max-body-bytes-in-flight 1M --port 0 --scripted "$SCRIPT" --tokenizer "$TOK"
expect bare_chat "no model given: pass -m DIR" -- "$CEDAR" chat
expect chat_missing_model "model folder '/nonexistent/cedar-model' does not exist" -- \
  "$CEDAR" chat -m /nonexistent/cedar-model

[ $failures -eq 0 ] || { echo "$failures CLI error check(s) failed"; exit 1; }
echo "all CLI error checks passed"
