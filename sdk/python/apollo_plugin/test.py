"""`python -m apollo_plugin.test my_plugin.py [--params JSON] [--class NAME]`

The checks of `apollo-agent plugin test`, for a plugin written on this SDK:
its describe is well formed and the file answers it as the agent runs it
(in worker mode, a request through `serve` too); validate takes the example
params and refuses bad ones (each required param left out, each typed param
of the wrong kind, an unknown param, and the class's bad_examples); execute
twice with one idempotency key gives one output (and one effect, when the
plugin has effect()); rollback succeeds, undoes the effect, and can run
twice. Prints a line per check; exits 0 when all passed, 1 otherwise.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from ._core import Plugin
from ._describe import DescribeError, type_error
from .testing import KEY, Harness

# What the agent passes to a plugin from its own environment (PLUGINS.md),
# and PYTHONPATH for a plugin registered with `env: [PYTHONPATH]`.
AGENT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR", "PYTHONPATH")
# Values to try as a param of the wrong kind: the first its type refuses.
WRONG = (42, "x", [1], {"x": 1}, True)


class Report:
    def __init__(self, out):
        self.out, self.ok = out, True

    def __call__(self, passed, what, detail=""):
        self.ok &= bool(passed)
        self.out.write("%s %s%s\n" % ("ok  " if passed else "FAIL", what, ": " + detail if detail else ""))


def load(path, name=None):
    """The Plugin class defined in the file at `path`."""
    sys.dont_write_bytecode = True  # no __pycache__ in a watched plugins dir
    stem = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location("apollo_plugin_under_test_" + stem.replace("-", "_"), path)
    if spec is None or spec.loader is None:
        raise SystemExit("%s: not a Python file" % path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Plugin) and v is not Plugin and v.__module__ == module.__name__
    ]
    if name:
        found = [c for c in found if c.__name__ == name]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise SystemExit("%s: expected one Plugin subclass%s, found %s (choose with --class)"
                         % (path, " named %s" % name if name else "", names))
    return found[0]


def _agent_env():
    return {k: os.environ[k] for k in AGENT_ENV if k in os.environ}


def as_the_agent_runs_it(path, describe, report):
    """`<file> describe` (and a worker's `serve`) in the agent's environment."""
    if not os.access(path, os.X_OK):
        report(False, "runs as a plugin", "%s is not executable (chmod +x %s)" % (path, path))
        return
    try:
        r = subprocess.run([os.path.abspath(path), "describe"], input=b"{}", capture_output=True,
                           env=_agent_env(), timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        report(False, "runs as a plugin", str(e))
        return
    said = r.stderr.decode(errors="replace").strip().splitlines()[-3:]
    try:
        printed = json.loads(r.stdout)
    except ValueError:
        printed = None
    if r.returncode != 0 or printed != describe:
        report(False, "runs as a plugin", "`%s describe` exited %d: %s" % (path, r.returncode, " | ".join(said) or r.stdout[:200]))
        return
    report(True, "runs as a plugin", "`%s describe` prints the describe" % os.path.basename(path))
    if describe.get("mode") != "worker":
        return
    request = {"id": 1, "call": "validate", "input": {"params": describe.get("example_params") or {}}, "env": {}}
    try:
        r = subprocess.run([os.path.abspath(path), "serve"], input=(json.dumps(request) + "\n").encode(),
                           capture_output=True, env=_agent_env(), timeout=10)
        replies = [json.loads(line) for line in r.stdout.decode().splitlines() if line.strip()]
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        report(False, "serves as a worker", str(e))
        return
    last = replies[-1] if replies else {}
    good = last.get("id") == 1 and ("result" in last or "error" in last) and r.returncode == 0
    report(good, "serves as a worker", json.dumps(last) if good else "`serve` answered %r, exit %d: %s"
           % (replies, r.returncode, r.stderr.decode(errors="replace").strip()[-300:]))


def bad_params(describe, params, extra):
    """Params validate must refuse, each with what makes it bad."""
    out = []
    declared = describe.get("params")
    if declared is not None:
        for p in declared:
            if p["required"] and p.get("default") is None and p["name"] in params:
                out.append(("without %s" % p["name"], {k: v for k, v in params.items() if k != p["name"]}))
            wrong = next((w for w in WRONG if type_error(p["name"], p["type"], w)), None)
            if wrong is not None:
                out.append(("%s of the wrong kind" % p["name"], dict(params, **{p["name"]: wrong})))
        out.append(("an unknown parameter", dict(params, no_such_param_x=1)))
    for i, bad in enumerate(extra or ()):
        out.append(("bad_examples[%d]" % i, bad))
    return out


def run(cls, path, params, out):
    with tempfile.TemporaryDirectory(prefix="apollo-plugin-test-") as work:
        return _run(cls, path, params, out, work)


def _run(cls, path, params, out, work):
    report = Report(out)
    try:
        h = Harness(cls, work_dir=work)
    except DescribeError as e:
        report(False, "describe", str(e))
        return False
    d = h.describe
    report(True, "describe", "%s %s (idempotent: %s, mode: %s)"
           % (d["name"], d["version"], str(d["idempotent"]).lower(), d["mode"]))
    if path:
        as_the_agent_runs_it(path, d, report)
    if params is None:
        params = d.get("example_params")
    if params is None:
        report(False, "params", "the class declares no example_params; pass --params '{...}'")
        return False
    v = h.validate(params)
    report(v.ok, "validate", json.dumps(params) if v.ok else v.error)
    for what, bad in bad_params(d, params, getattr(cls, "bad_examples", ())):
        r = h.validate(bad)
        report(not r.ok, "validate refuses %s" % what, r.error if not r.ok else "ACCEPTED %s" % json.dumps(bad))
    if not v.ok:
        return False
    before = h.effect(params)
    outputs, logs = [], []
    for attempt in (1, 2):
        r = h.execute(params, attempt=attempt)
        logs += r.logs
        report(r.ok, "execute #%d" % attempt, json.dumps(r.output) if r.ok else r.error)
        if r.ok:
            outputs.append(r.output)
        if attempt == 1:
            after_one = h.effect(params)
    if len(outputs) == 2:
        same = outputs[0] == outputs[1]
        report(same, "idempotent", "the same idempotency key (%s) gave the same output" % KEY if same else
               "NOT idempotent: the same idempotency key (%s) gave different outputs: %s then %s"
               % (KEY, json.dumps(outputs[0]), json.dumps(outputs[1])))
        if hasattr(h.plugin, "effect"):
            after_two = h.effect(params)
            report(after_two == after_one, "one effect", "the second execute changed nothing" if after_two == after_one
                   else "the second execute changed the effect: %r then %r" % (after_one, after_two))
    r = h.rollback(params, output=outputs[0] if outputs else None)
    logs += r.logs
    report(r.ok, "rollback", "" if r.ok else r.error)
    if r.ok and hasattr(h.plugin, "effect"):
        undone = h.effect(params)
        report(undone == before, "rollback undoes it", "the effect is as before execute" if undone == before
               else "before execute %r, after rollback %r" % (before, undone))
    if r.ok:
        again = h.rollback(params, output=outputs[0] if outputs else None)
        report(again.ok, "rollback twice", "" if again.ok else again.error)
    if logs:
        out.write("logged by the calls:\n")
        for line in logs[:20]:
            out.write("  %s\n" % line)
    out.write("all checks passed\n" if report.ok else "some checks failed\n")
    return report.ok


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m apollo_plugin.test", description=__doc__.split("\n\n")[1])
    ap.add_argument("file", help="the plugin's Python file")
    ap.add_argument("--params", help="params as JSON (default: the class's example_params)")
    ap.add_argument("--class", dest="cls", help="the Plugin subclass, when the file defines several")
    args = ap.parse_args(argv)
    params = None
    if args.params is not None:
        try:
            params = json.loads(args.params)
        except ValueError as e:
            ap.error("--params: not JSON: %s" % e)
        if not isinstance(params, dict):
            ap.error("--params: expected a JSON object such as '{\"host\": \"web-1\"}'")
    cls = load(args.file, args.cls)
    return 0 if run(cls, args.file, params, sys.stdout) else 1


if __name__ == "__main__":
    sys.exit(main())
