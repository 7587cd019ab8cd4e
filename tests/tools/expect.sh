# Sourced by the command-line tests (cli_test.sh, hostile_cli_test.sh): a scratch directory $work removed at exit,
# the counters, and the two assertions. Set expect_timeout (seconds) before sourcing to bound every expected command.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# expect NAME EXIT_CODE REGEX -- COMMAND...: COMMAND must exit with EXIT_CODE (within expect_timeout seconds, if set)
# and print REGEX.
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  local output status
  output=$(timeout "${expect_timeout:-0}" "$@" 2>&1)
  status=$?
  if [[ $status -eq $code ]] && grep -Eq -- "$pattern" <<<"$output"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    printf 'FAILED %s: exit %s (expected %s), output:\n%s\n' "$name" "$status" "$code" "${output:0:2000}"
  fi
}

# check NAME COMMAND...: a plain assertion (exit 0 passes).
check() {
  local name=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    printf 'FAILED %s\n' "$name"
  fi
}

# The last line of a test: the counts, and its exit status.
summary() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
