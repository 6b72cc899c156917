#!/usr/bin/env python3
"""An Apollo-11 external plugin: registers a host in a JSON inventory file.

Protocol (see PLUGINS.md): `inventory.py describe|validate|execute|rollback`,
one JSON document on stdin, one JSON object on stdout, log lines on stderr,
exit 0 for success, 75 to ask for a retry, anything else for a permanent error.

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
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def reply(obj, code=0):
    print(json.dumps(obj))
    sys.exit(code)


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


def main():
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb == "describe":
        reply(DESCRIBE)
    doc = json.load(sys.stdin)
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


if __name__ == "__main__":
    main()
