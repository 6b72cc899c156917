"""The protocol (PLUGINS.md), both modes, from one Plugin class.

One-shot: `<exe> describe|validate|execute|rollback`, one JSON document on
stdin, one JSON object on stdout, log lines on stderr; exit 0, 75 (retry)
or 1 (permanent). Worker: `<exe> serve`, a JSON request a line in, replies
and log lines a line out, each carrying the request's id.

While a call runs, sys.stdout is the log: a stray print() cannot break the
reply.
"""
import json
import os
import sys

from . import _core, _describe

EX_TEMPFAIL = 75


def _program():
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "plugin"


def _say(msg):
    print("apollo_plugin: %s: %s" % (_program(), msg), file=sys.stderr, flush=True)


def main(cls, argv):
    verb = argv[0] if argv else ""
    try:
        runner = _core.Runner(cls)
    except _describe.DescribeError as e:
        _say("describe is not valid: %s" % e)
        if verb in ("describe", "validate", "execute", "rollback"):
            print(json.dumps({"error": "describe is not valid: %s" % e}), flush=True)
        sys.exit(2)
    if verb == "serve":
        try:
            serve(runner)
        except Exception as e:  # the SDK or setup() broke: say why, where the agent reads it
            _say("the worker stopped: %s" % _core.describe_exception(e))
            sys.exit(70)
        return
    if verb == "describe":
        print(json.dumps(runner.describe), flush=True)
        return
    if verb not in ("validate", "execute", "rollback"):
        _say("unknown call %s (expected describe, validate, execute, rollback or serve)" % json.dumps(verb))
        print(json.dumps({"error": "unknown call %s" % json.dumps(verb)}), flush=True)
        sys.exit(2)
    sys.exit(oneshot(runner, verb, sys.stdin, sys.stdout))


def oneshot(runner, verb, stdin, stdout):
    """One call of a process; returns its exit status."""
    try:
        doc = json.load(stdin)
    except ValueError as e:
        print(json.dumps({"error": "stdin is not one JSON document: %s" % e}), file=stdout, flush=True)
        return 1
    if not isinstance(doc, dict):
        print(json.dumps({"error": "stdin is not a JSON object"}), file=stdout, flush=True)
        return 1
    real, sys.stdout = sys.stdout, sys.stderr
    try:
        outcome = runner.call(verb, doc, dict(os.environ))
    finally:
        sys.stdout = real
    if outcome.ok:
        print(json.dumps(outcome.output), file=stdout, flush=True)
        return 1 if verb == "validate" and not outcome.output.get("ok") else 0
    print(json.dumps({"error": outcome.error}), file=stdout, flush=True)
    return EX_TEMPFAIL if outcome.retryable else 1


def serve(runner, stdin=None, stdout=None):
    """Worker mode: answers requests until stdin closes."""
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    sys.stdout = sys.stderr
    base = dict(os.environ)

    def send(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            _say("a request that is not JSON was skipped: %s" % e)
            continue
        rid = req.get("id")
        env = req.get("env") or {}
        # The call's variables for this call only, so what it starts inherits them.
        os.environ.clear()
        os.environ.update(base)
        os.environ.update(env)
        runner.ready()  # setup(): raising here ends the worker, told on stderr
        outcome = runner.call(
            req.get("call", ""), req.get("input") or {}, env, lambda text, rid=rid: send({"id": rid, "log": text})
        )
        if outcome.ok:
            send({"id": rid, "result": outcome.output})
        else:
            send({"id": rid, "error": outcome.error, "retryable": outcome.retryable})
