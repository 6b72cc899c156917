#!/usr/bin/env python3
"""An Apollo-11 external plugin: registers a host in a JSON inventory file.

Protocol (see PLUGINS.md), in both modes:
- one-shot: `inventory.py describe|validate|execute|rollback`, one JSON
  document on stdin, one JSON object on stdout, log lines on stderr, exit 0
  for success, 75 to ask for a retry, anything else for a permanent error;
- worker (describe says "mode": "worker"): `inventory.py serve` stays up and
  answers one JSON request a line on stdin with one JSON reply a line on
  stdout, for many calls; `serve` below maps the one-shot exit statuses onto
  replies, so `handle` is the same code in both modes.

Idempotent: an entry is keyed by the step's idempotency key, so a retried or
repeated execute finds the entry it made and returns it unchanged. Rollback
removes exactly that entry.
"""
import fcntl
import json
import os
import sys

DESCRIBE = {
    "name": "inventory",
    "version": "1.2.0",
    "description": "Registers a host in a JSON inventory file (idempotent by idempotency key)",
    "idempotent": True,
    "params": [
        {"name": "host", "type": "string", "required": True, "description": "host name"},
        {"name": "role", "type": "string", "required": False, "description": "role, default 'generic'"},
        {"name": "inventory", "type": "path", "required": False,
         "description": "inventory file, relative to the work dir (default inventory.json)"},
    ],
    "example_params": {"host": "web-1", "role": "web"},
    "mode": "worker",
}

# The request being served in worker mode (None in one-shot mode).
CURRENT = None


class Reply(Exception):
    """The answer to a call: an object and the one-shot exit status."""

    def __init__(self, obj, code):
        super().__init__()
        self.obj, self.code = obj, code


def log(msg):
    if CURRENT is None:
        print(msg, file=sys.stderr, flush=True)
    else:
        # In worker mode a log line travels with the call it belongs to.
        print(json.dumps({"id": CURRENT, "log": msg}), flush=True)


def reply(obj, code=0):
    raise Reply(obj, code)


def validate(params):
    host = params.get("host")
    if not isinstance(host, str) or not host:
        return "host: required, a non-empty string (e.g. host: web-1)"
    if "role" in params and not isinstance(params["role"], str):
        return "role: expected a string"
    unknown = set(params) - {"host", "role", "inventory"}
    if unknown:
        return "unknown parameter %r (expected host, role, inventory)" % sorted(unknown)[0]
    return None


class Inventory:
    """The inventory file, locked for the duration of a call."""

    def __init__(self, path):
        self.path = path
        self.lock = open(path + ".lock", "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            with open(path) as f:
                self.data = json.load(f)
        except FileNotFoundError:
            self.data = {"hosts": {}}

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=2, sort_keys=True)
        os.replace(tmp, self.path)


def handle(verb, doc):
    """One call; it ends by raising Reply."""
    if verb == "describe":
        reply(DESCRIBE)
    params = doc.get("params", {})
    if verb == "validate":
        err = validate(params)
        reply({"ok": err is None, "error": err}, 0 if err is None else 1)
    err = validate(params)
    if err:
        reply({"error": err}, 1)
    path = os.path.join(doc["work_dir"], params.get("inventory", "inventory.json"))
    key = doc["idempotency_key"]
    inv = Inventory(path)
    hosts = inv.data["hosts"]
    if verb == "execute":
        entry = hosts.get(key)
        if entry:
            log("host %s already registered by %s; returning that entry" % (entry["host"], key))
        else:
            entry = {"host": params["host"], "role": params.get("role", "generic"), "serial": len(hosts) + 1}
            hosts[key] = entry
            inv.save()
            log("registered %s as %s" % (entry["host"], entry["role"]))
        reply(dict(entry, inventory=path))
    if verb == "rollback":
        if hosts.pop(key, None) is not None:
            inv.save()
            log("removed the entry made by %s" % key)
        reply({"rolled_back": True})
    reply({"error": "unknown call %r (expected describe, validate, execute, rollback)" % verb}, 2)


def serve():
    """Worker mode: {"id", "call", "input", "env"} in, {"id", "result"} or
    {"id", "error", "retryable"} out, until stdin closes."""
    global CURRENT
    base = dict(os.environ)
    for line in sys.stdin:
        req = json.loads(line)
        CURRENT = req["id"]
        # The call's variables (APOLLO_IDEMPOTENCY_KEY, ...) for this call only,
        # so anything it starts inherits them, as in one-shot mode.
        os.environ.clear()
        os.environ.update(base)
        os.environ.update(req.get("env", {}))
        try:
            handle(req["call"], req["input"])
            out = {"id": CURRENT, "error": "no reply"}
        except Reply as r:
            if r.code == 0:
                out = {"id": CURRENT, "result": r.obj}
            else:
                out = {"id": CURRENT, "error": r.obj.get("error") or "failed", "retryable": r.code == 75}
        except Exception as e:  # a bug in one call must not end the worker
            out = {"id": CURRENT, "error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out), flush=True)
        CURRENT = None


def main():
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb == "serve":
        serve()
        return
    try:
        handle(verb, {} if verb == "describe" else json.load(sys.stdin))
    except Reply as r:
        print(json.dumps(r.obj))
        sys.exit(r.code)


if __name__ == "__main__":
    main()
