"""The base class, the context a call gets, and one call carried out: the
same code answers a one-shot process, a worker's request and the harness."""
import json
import os
import sys
import sysconfig
import traceback

from . import _describe


class Retry(Exception):
    """A failure worth another attempt (exit 75, `"retryable": true`)."""


class Fail(Exception):
    """A permanent failure: the step fails without another attempt."""


class Context:
    """What a call knows besides its params.

    Attributes: idempotency_key, task_id (the instance's id), trace_id, task
    (its name), step, attempt, work_dir, steps (earlier steps' outputs by
    name), task_params (the instance's params), dry_run, output (for a
    rollback: what execute returned, None when it never succeeded),
    rolling_back, and env (the call's APOLLO_* variables).
    """

    def __init__(self, doc, env=None, log=None):
        ctx = doc.get("context") or {}
        self.idempotency_key = doc.get("idempotency_key", "")
        self.task_id = doc.get("task_id") or ctx.get("task_id", "")
        self.trace_id = ctx.get("trace_id", "")
        self.task = ctx.get("task", "")
        self.step = doc.get("step", "")
        self.attempt = doc.get("attempt", 1)
        self.work_dir = doc.get("work_dir") or ctx.get("work_dir") or os.getcwd()
        self.steps = ctx.get("steps") or {}
        self.task_params = ctx.get("params") or {}
        self.dry_run = bool(doc.get("dry_run", False))
        self.output = doc.get("output")
        self.rolling_back = "output" in doc or (env or {}).get("APOLLO_ROLLBACK") == "1"
        self.env = dict(env or {})
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def log(self, *parts):
        """A line for the step's log (`apollo logs ID --step NAME`)."""
        text = " ".join(str(p) for p in parts)
        for line in text.splitlines() or [""]:
            self._log(line)

    def path(self, *parts):
        """A path in the work dir (absolute paths are kept as they are)."""
        return os.path.join(self.work_dir, *parts)

    def retry(self, reason):
        """Ends the call as a failure the agent retries with backoff."""
        raise Retry(reason)

    def fail(self, reason):
        """Ends the call as a permanent failure."""
        raise Fail(reason)


class Plugin:
    """Subclass it, set the class attributes, implement what you need.

    Class attributes (the describe): name, version (semantic), description
    (default: the docstring's first line), idempotent (default False), mode
    ("oneshot", the default, or "worker"), params (a list of Param), outputs
    (the fields execute returns), example_params (what `plugin test` uses),
    and for the harness bad_examples (params validate must refuse).

    Methods: setup() once per process before its first call; validate(params)
    returns None (or True) when the params are fine, or an error string;
    execute(params, ctx) returns a dict, the step's output; rollback(params,
    ctx) undoes execute (ctx.output is what it returned) and must be safe to
    run twice; effect(params, ctx) optionally returns what execute changed
    (say, the file's content), so the harness can check one effect and an
    undo. Raise ctx.retry(...)/ctx.fail(...) or Retry/Fail to fail a call.
    """

    name = None
    version = None
    description = None
    idempotent = False
    mode = "oneshot"
    params = None
    outputs = None
    example_params = None
    bad_examples = ()

    def setup(self):
        pass

    def validate(self, params):
        return None

    def execute(self, params, ctx):
        raise Fail("%s: execute is not implemented" % self.name)

    def rollback(self, params, ctx):
        return None

    @classmethod
    def describe(cls):
        """The describe document; DescribeError names a field that is wrong."""
        return _describe.build(cls)

    @classmethod
    def main(cls, argv=None):
        """The plugin's entry point: `if __name__ == "__main__": MyPlugin.main()`."""
        from . import _serve

        _serve.main(cls, sys.argv[1:] if argv is None else argv)


class Outcome:
    """How a call ended: ok with output, or an error, retryable or not."""

    def __init__(self, ok, output=None, error=None, retryable=False):
        self.ok, self.output, self.error, self.retryable = ok, output, error, retryable

    def __repr__(self):
        if self.ok:
            return "Outcome(ok, %r)" % (self.output,)
        return "Outcome(%s, %r)" % ("retryable" if self.retryable else "permanent", self.error)


_SDK_DIR = os.path.dirname(os.path.abspath(__file__))
_STDLIB = tuple(
    os.path.abspath(p) for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p
)


def where(exc):
    """file:line of the last frame of the plugin's own code (outside the
    standard library and this SDK), else of the last frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    own = [
        f
        for f in frames
        if not os.path.abspath(f.filename).startswith(_SDK_DIR) and not os.path.abspath(f.filename).startswith(_STDLIB)
    ]
    f = (own or frames)[-1]
    return "%s:%d" % (os.path.basename(f.filename), f.lineno)


def describe_exception(exc):
    """`ValueError: what it said (at my_plugin.py:42)`, one line."""
    text = str(exc).strip().replace("\n", " ")
    at = where(exc)
    head = type(exc).__name__ + (": " + text if text else "")
    return head + (" (at %s)" % at if at else "")


def _jsonable(what, value):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise Fail("%s returned what JSON cannot carry: %s" % (what, e)) from None


class Runner:
    """One plugin object and its describe, answering calls."""

    def __init__(self, cls):
        self.describe = cls.describe()
        self.plugin = cls()
        self._ready = False

    def ready(self):
        if not self._ready:
            self._ready = True
            self.plugin.setup()

    def call(self, verb, doc, env=None, log=None):
        """Carries out validate, execute or rollback; never raises for what
        the plugin does (its exceptions are failures, as the agent sees them)."""
        try:
            self.ready()
            return self._call(verb, doc, env, log)
        except Retry as e:
            return Outcome(False, error=str(e) or "retry asked", retryable=True)
        except Fail as e:
            return Outcome(False, error=str(e) or "failed")
        except Exception as e:  # the plugin's own bug: permanent, located
            return Outcome(False, error=describe_exception(e))

    def _params(self, doc):
        params = dict(doc.get("params") or {})
        declared = self.describe.get("params")
        if declared is not None:
            err = _describe.check(declared, params, self.describe.get("example_params"))
            if err:
                raise Fail(err)
        return params

    def _validate(self, params):
        verdict = self.plugin.validate(params)
        if verdict is None or verdict is True:
            return None
        if verdict is False:
            return "invalid params"
        return str(verdict)

    def _call(self, verb, doc, env, log):
        if verb == "validate":
            try:
                params = self._params(doc)
                err = self._validate(params)
            except Fail as e:
                err = str(e)
            if err:
                return Outcome(True, {"ok": False, "error": err})
            return Outcome(True, {"ok": True})
        if verb not in ("execute", "rollback"):
            raise Fail("unknown call %s (expected describe, validate, execute, rollback)" % json.dumps(verb))
        params = self._params(doc)
        ctx = Context(doc, env, log)
        if verb == "execute":
            err = self._validate(params)
            if err:
                raise Fail(err)
            out = self.plugin.execute(params, ctx)
        else:
            out = self.plugin.rollback(params, ctx)
        if out is None:
            out = {}
        if not isinstance(out, dict):
            raise Fail("%s returned %s, expected a dict (the step's output)" % (verb, _describe.kind(out)))
        return Outcome(True, _jsonable(verb, out))
