"""Calling a plugin in the author's own tests, in process, as the agent would.

    from apollo_plugin.testing import Harness

    def test_register(tmp_path):
        h = Harness(Inventory, work_dir=tmp_path)
        first = h.execute({"host": "web-1"})
        assert first.ok and first.output["host"] == "web-1"
        assert h.execute({"host": "web-1"}).output == first.output  # one key, one effect
        assert h.rollback({"host": "web-1"}, output=first.output).ok

Each call gets the document and variables the agent would give (work dir,
idempotency key, attempt, earlier steps' outputs), through a JSON round trip,
and returns an Outcome (ok, output, error, retryable) with the lines it
logged in `.logs`.
"""
import contextlib
import io
import json
import os
import tempfile

from ._core import Runner

KEY = "plugin-test:0"


@contextlib.contextmanager
def _environ(env):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class _Lines(io.TextIOBase):
    """Text written to it, as lines appended to a list."""

    def __init__(self, lines):
        super().__init__()
        self.lines, self.part = lines, ""

    def write(self, text):
        *done, self.part = (self.part + text).split("\n")
        self.lines.extend(done)
        return len(text)

    def flush(self):
        if self.part:
            self.lines.append(self.part)
            self.part = ""


class Harness:
    """A plugin class under test; `work_dir` defaults to a new temp dir."""

    def __init__(self, plugin_cls, work_dir=None, task_id="plugin-test", task="plugin-test", step="under-test"):
        self.runner = Runner(plugin_cls)  # a describe that is not valid raises DescribeError here
        self.describe = self.runner.describe
        self.plugin = self.runner.plugin
        self.work_dir = str(work_dir) if work_dir is not None else tempfile.mkdtemp(prefix="apollo-plugin-")
        self.task_id, self.task, self.step = task_id, task, step

    def document(self, params, key=KEY, attempt=1, steps=None, task_params=None, output=None, rollback=False):
        """The input document of an execute (or, with rollback, a rollback)."""
        doc = {
            "params": params,
            "context": {
                "task": self.task,
                "task_id": self.task_id,
                "trace_id": self.task_id,
                "params": task_params or {},
                "steps": steps or {},
                "work_dir": self.work_dir,
            },
            "task_id": self.task_id,
            "step": self.step,
            "attempt": attempt,
            "idempotency_key": key,
            "work_dir": self.work_dir,
            "dry_run": False,
        }
        if rollback:
            doc["output"] = output
        return doc

    def env(self, doc, rollback=False):
        env = {
            "APOLLO_IDEMPOTENCY_KEY": doc["idempotency_key"],
            "APOLLO_WORK_DIR": doc["work_dir"],
            "APOLLO_STEP": doc["step"],
            "APOLLO_ATTEMPT": str(doc["attempt"]),
            "APOLLO_TASK_ID": doc["task_id"],
            "APOLLO_TRACE_ID": doc["context"]["trace_id"],
        }
        if rollback:
            env["APOLLO_ROLLBACK"] = "1"
        return env

    def _call(self, verb, doc, env):
        logs = []
        doc = json.loads(json.dumps(doc))  # what the agent can send is JSON
        printed = _Lines(logs)  # a stray print() is a log line, as under the agent
        with _environ(env), contextlib.redirect_stdout(printed):
            outcome = self.runner.call(verb, doc, env, logs.append)
        printed.flush()
        outcome.logs = logs
        return outcome

    def validate(self, params):
        """ok is whether the params were accepted; error says why not."""
        out = self._call("validate", {"params": params}, {})
        if out.ok and not out.output.get("ok"):
            out.ok, out.error = False, out.output.get("error") or "refused"
        return out

    def execute(self, params, **kw):
        """kw: key, attempt, steps, task_params."""
        doc = self.document(params, **kw)
        return self._call("execute", doc, self.env(doc))

    def rollback(self, params, output=None, **kw):
        """`output` is what execute returned (None: it never succeeded)."""
        doc = self.document(params, output=output, rollback=True, **kw)
        return self._call("rollback", doc, self.env(doc, rollback=True))

    def effect(self, params, **kw):
        """What the plugin's effect() reports, or None when it has none."""
        probe = getattr(self.plugin, "effect", None)
        if probe is None:
            return None
        from ._core import Context

        doc = json.loads(json.dumps(self.document(params, **kw)))
        with _environ(self.env(doc)):
            return probe(self.runner._params(doc), Context(doc, self.env(doc), lambda line: None))
