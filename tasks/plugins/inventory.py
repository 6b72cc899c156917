#!/usr/bin/env python3
"""Registers a host in a JSON inventory file, on the Python SDK (sdk/python).

Idempotent: an entry is keyed by the step's idempotency key, so a retried or
repeated execute finds the entry it made and returns it unchanged; rollback
removes exactly that entry. Worker mode: one process serves many calls.
"""
import contextlib
import fcntl
import json
import os
import sys

try:
    from apollo_plugin import Param, Plugin
except ImportError:  # run from a checkout without the SDK installed: the one beside it
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "sdk", "python"))
    from apollo_plugin import Param, Plugin


class Inventory(Plugin):
    name = "inventory"
    version = "1.2.0"
    description = "Registers a host in a JSON inventory file (idempotent by idempotency key)"
    idempotent = True
    mode = "worker"
    params = [
        Param("host", "string", required=True, description="host name"),
        Param("role", "string", description="role, default 'generic'"),
        Param("inventory", "path", description="inventory file, relative to the work dir (default inventory.json)"),
    ]
    outputs = ["host", "role", "serial", "inventory"]
    example_params = {"host": "web-1", "role": "web"}
    bad_examples = [{"host": ""}]

    def validate(self, params):
        if not params["host"]:
            return "host: required, a non-empty string (e.g. host: web-1)"

    def execute(self, params, ctx):
        with self.hosts(params, ctx) as (path, hosts):
            entry = hosts.get(ctx.idempotency_key)
            if entry:
                ctx.log("host %s already registered by %s; returning that entry" % (entry["host"], ctx.idempotency_key))
            else:
                entry = {"host": params["host"], "role": params.get("role", "generic"), "serial": len(hosts) + 1}
                hosts[ctx.idempotency_key] = entry
                ctx.log("registered %s as %s" % (entry["host"], entry["role"]))
            return dict(entry, inventory=path)

    def rollback(self, params, ctx):
        with self.hosts(params, ctx) as (_, hosts):
            if hosts.pop(ctx.idempotency_key, None) is not None:
                ctx.log("removed the entry made by %s" % ctx.idempotency_key)
        return {"rolled_back": True}

    def effect(self, params, ctx):
        with self.hosts(params, ctx) as (_, hosts):
            return hosts.get(ctx.idempotency_key)

    @contextlib.contextmanager
    def hosts(self, params, ctx):
        """The inventory's hosts, locked while in use and saved when changed."""
        path = ctx.path(params.get("inventory", "inventory.json"))
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(path) as f:
                    hosts = json.load(f)["hosts"]
            except FileNotFoundError:
                hosts = {}
            before = json.dumps(hosts, sort_keys=True)
            yield path, hosts
            if json.dumps(hosts, sort_keys=True) != before:
                with open(path + ".tmp", "w") as f:
                    json.dump({"hosts": hosts}, f, indent=2, sort_keys=True)
                os.replace(path + ".tmp", path)


if __name__ == "__main__":
    Inventory.main()
