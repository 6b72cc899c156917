#!/bin/sh
# An Apollo-11 external plugin in plain shell: measures the disk usage of a
# directory and writes a report file.
#
# Protocol (see PLUGINS.md): `disk_usage.sh describe|validate|execute|rollback`,
# one JSON document on stdin, one JSON object on stdout, log lines on stderr.
# Idempotent: the report is named after the idempotency key and a repeated
# execute returns the report it already wrote. Rollback deletes that report.
set -u

field() { # the value of a top-level string param, from the one-line JSON on stdin
	printf '%s' "$doc" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"
}

case "${1:-}" in
describe)
	cat <<'JSON'
{"name": "disk_usage", "version": "1.0.1", "idempotent": true,
 "description": "Measures a directory's disk usage and writes a report file",
 "params": [{"name": "path", "type": "path", "required": true, "description": "directory to measure"},
            {"name": "max_kb", "type": "string", "required": false, "description": "fail (permanently) above this many KiB"}],
 "example_params": {"path": "/tmp"}}
JSON
	exit 0 ;;
esac

doc=$(cat)
path=$(field path)
case "${1:-}" in
validate)
	if [ -z "$path" ]; then
		echo '{"ok": false, "error": "path: required, a directory (e.g. path: /var/log)"}'
		exit 1
	fi
	echo '{"ok": true}' ;;
execute)
	key=$(field idempotency_key | tr ':' '_')
	report="$APOLLO_WORK_DIR/disk-usage-$key.txt"
	if [ ! -d "$path" ]; then
		echo "{\"error\": \"path: $path is not a directory\"}"
		exit 1
	fi
	if [ -f "$report" ]; then
		echo "report $report exists; not measuring again" >&2
	else
		du -sk "$path" 2>/dev/null | cut -f1 > "$report.tmp" && mv "$report.tmp" "$report"
		echo "measured $path" >&2
	fi
	kb=$(cat "$report")
	max=$(field max_kb)
	if [ -n "$max" ] && [ "$kb" -gt "$max" ]; then
		echo "{\"error\": \"$path uses $kb KiB, more than max_kb $max\"}"
		exit 1
	fi
	echo "{\"path\": \"$path\", \"kbytes\": $kb, \"report\": \"$report\"}" ;;
rollback)
	key=$(field idempotency_key | tr ':' '_')
	rm -f "$APOLLO_WORK_DIR/disk-usage-$key.txt"
	echo "removed the report of $key" >&2
	echo '{"rolled_back": true}' ;;
*)
	echo "{\"error\": \"unknown call ${1:-} (expected describe, validate, execute, rollback)\"}"
	exit 2 ;;
esac
