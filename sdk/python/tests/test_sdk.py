"""The SDK's own tests: the protocol it speaks in both modes, the checks it
makes, and the harness. Plugins are written to files and run as the agent
runs them (a process, JSON on stdin and stdout)."""
import json
import os
import subprocess
import sys

import pytest

SDK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, SDK)

from apollo_plugin import DescribeError, Fail, Param, Plugin  # noqa: E402
from apollo_plugin.testing import Harness  # noqa: E402

PLUGIN = '''\
#!/usr/bin/env python3
import os
from apollo_plugin import Param, Plugin

class Touch(Plugin):
    """Writes a file named by the idempotency key."""
    name = "touch"
    version = "1.0.0"
    idempotent = True
    mode = MODE
    params = [Param("text", "string", required=True), Param("times", "integer", default=1)]
    example_params = {"text": "hi"}

    def execute(self, params, ctx):
        if params["text"] == "retry":
            ctx.retry("not yet")
        if params["text"] == "fail":
            ctx.fail("no such thing")
        if params["text"] == "boom":
            return 1 // 0
        if params["text"] == "env":
            return {"key": os.environ["APOLLO_IDEMPOTENCY_KEY"]}
        print("a stray print")
        ctx.log("writing", params["text"] * params["times"])
        with open(ctx.path(ctx.idempotency_key), "w") as f:
            f.write(params["text"] * params["times"])
        return {"path": ctx.path(ctx.idempotency_key), "text": params["text"]}

    def rollback(self, params, ctx):
        if os.path.exists(ctx.path(ctx.idempotency_key)):
            os.remove(ctx.path(ctx.idempotency_key))

    def effect(self, params, ctx):
        return os.path.exists(ctx.path(ctx.idempotency_key))

if __name__ == "__main__":
    Touch.main()
'''


def write(tmp_path, text, name="plug.py"):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def env():
    return dict(os.environ, PYTHONPATH=SDK)


def oneshot(path, verb, doc, extra_env=None):
    r = subprocess.run([path, verb], input=json.dumps(doc).encode(), capture_output=True, env=dict(env(), **(extra_env or {})))
    return r.returncode, json.loads(r.stdout), r.stderr.decode()


def execute_doc(tmp_path, params, key="I1:0"):
    return {"params": params, "idempotency_key": key, "work_dir": str(tmp_path), "attempt": 2, "step": "s",
            "task_id": "I1", "context": {"task": "t", "task_id": "I1", "trace_id": "T1", "steps": {}, "params": {}}}


@pytest.fixture
def plug(tmp_path):
    return write(tmp_path, PLUGIN.replace("MODE", '"oneshot"'))


def test_describe_is_built_from_the_class(plug):
    code, d, _ = oneshot(plug, "describe", {})
    assert code == 0
    assert d["name"] == "touch" and d["version"] == "1.0.0" and d["idempotent"] is True and d["mode"] == "oneshot"
    assert d["description"] == "Writes a file named by the idempotency key."
    assert d["params"][0] == {"name": "text", "type": "string", "required": True, "description": ""}
    assert d["params"][1]["default"] == 1


def test_oneshot_success_writes_only_the_output_on_stdout(plug, tmp_path):
    code, out, err = oneshot(plug, "execute", execute_doc(tmp_path, {"text": "ab", "times": 2}))
    assert code == 0, err
    assert out == {"path": str(tmp_path / "I1:0"), "text": "ab"}
    assert (tmp_path / "I1:0").read_text() == "abab"
    assert "a stray print" in err and "writing abab" in err


def test_oneshot_failures_map_to_the_exit_statuses(plug, tmp_path):
    assert oneshot(plug, "execute", execute_doc(tmp_path, {"text": "retry"}))[:2] == (75, {"error": "not yet"})
    assert oneshot(plug, "execute", execute_doc(tmp_path, {"text": "fail"}))[:2] == (1, {"error": "no such thing"})
    code, out, _ = oneshot(plug, "execute", execute_doc(tmp_path, {"text": "boom"}))
    line = PLUGIN.splitlines().index('            return 1 // 0') + 1
    assert (code, out["error"]) == (1, "ZeroDivisionError: integer division or modulo by zero (at plug.py:%d)" % line)


def test_params_are_checked_in_the_agents_words_before_validate(plug, tmp_path):
    assert oneshot(plug, "validate", {"params": {"text": "x"}})[:2] == (0, {"ok": True})
    cases = [
        ({}, "text: missing (e.g. text: hi)"),
        ({"text": 3}, "text: expected a string, found a number"),
        ({"text": "x", "times": "2"}, 'times: expected an integer, found "2"'),
        ({"text": "x", "tmes": 2}, 'unknown parameter "tmes" (did you mean "times"? expected one of: text, times)'),
    ]
    for params, error in cases:
        assert oneshot(plug, "validate", {"params": params})[:2] == (1, {"ok": False, "error": error})
    # execute refuses them too, permanently
    assert oneshot(plug, "execute", execute_doc(tmp_path, {"text": 3}))[:2] == (1, {"error": cases[1][1]})


def test_a_describe_that_is_not_valid_is_refused_at_start_naming_the_field(tmp_path):
    for wrong, field in [('version = "1.0"', "version"), ('mode = "pool"', "mode")]:
        path = write(tmp_path, PLUGIN.replace("MODE", '"oneshot"').replace('example_params = {"text": "hi"}', 'example_params = {"text": "hi"}\n    ' + wrong))
        r = subprocess.run([path, "describe"], input=b"{}", capture_output=True, env=env())
        assert r.returncode == 2
        assert ("describe is not valid: %s:" % field) in r.stderr.decode()
    path = write(tmp_path, PLUGIN.replace("MODE", '"oneshot"').replace('Param("times", "integer"', 'Param("times", "integr"'))
    r = subprocess.run([path, "describe"], input=b"{}", capture_output=True, env=env())
    assert 'params[1] (times).type: unknown type "integr" (did you mean "integer"?' in r.stderr.decode()


def serve(path, requests, extra_env=None):
    lines = "".join(json.dumps(r) + "\n" for r in requests).encode()
    r = subprocess.run([path, "serve"], input=lines, capture_output=True, env=dict(env(), **(extra_env or {})), timeout=20)
    return r.returncode, [json.loads(line) for line in r.stdout.decode().splitlines()], r.stderr.decode()


def test_a_worker_answers_each_request_with_its_id_and_logs_travel_with_it(tmp_path):
    path = write(tmp_path, PLUGIN.replace("MODE", '"worker"'))
    reqs = [
        {"id": 1, "call": "validate", "input": {"params": {}}},
        {"id": 2, "call": "execute", "input": execute_doc(tmp_path, {"text": "x"}), "env": {}},
        {"id": 3, "call": "execute", "input": execute_doc(tmp_path, {"text": "retry"})},
        {"id": 4, "call": "execute", "input": execute_doc(tmp_path, {"text": "boom"})},
        {"id": 5, "call": "execute", "input": execute_doc(tmp_path, {"text": "env"}), "env": {"APOLLO_IDEMPOTENCY_KEY": "K5"}},
        {"id": 6, "call": "rollback", "input": dict(execute_doc(tmp_path, {"text": "x"}), output={})},
    ]
    code, replies, err = serve(path, reqs)
    assert code == 0, err
    assert replies[0] == {"id": 1, "result": {"ok": False, "error": "text: missing (e.g. text: hi)"}}
    assert replies[1] == {"id": 2, "log": "writing x"}
    assert replies[2] == {"id": 2, "result": {"path": str(tmp_path / "I1:0"), "text": "x"}}
    assert replies[3] == {"id": 3, "error": "not yet", "retryable": True}
    assert replies[4]["id"] == 4 and replies[4]["retryable"] is False and "ZeroDivisionError" in replies[4]["error"]
    assert replies[5] == {"id": 5, "result": {"key": "K5"}}
    assert replies[6] == {"id": 6, "result": {}}
    assert not (tmp_path / "I1:0").exists()
    assert "a stray print" in err  # stderr, never a reply


def test_a_worker_whose_setup_raises_exits_saying_why(tmp_path):
    text = PLUGIN.replace("MODE", '"worker"').replace(
        "    def rollback", "    def setup(self):\n        raise RuntimeError('no config file')\n\n    def rollback")
    path = write(tmp_path, text)
    code, replies, err = serve(path, [{"id": 1, "call": "execute", "input": execute_doc(tmp_path, {"text": "x"})}])
    assert code == 70 and replies == []
    assert "the worker stopped: RuntimeError: no config file (at plug.py:" in err


def test_the_harness_calls_in_process():
    class Echo(Plugin):
        name, version = "echo", "0.1.0"
        params = [Param("say", "string", required=True)]

        def execute(self, params, ctx):
            ctx.log("said", params["say"])
            if params["say"] == "no":
                raise Fail("refused")
            return {"said": params["say"], "key": ctx.idempotency_key}

    h = Harness(Echo)
    r = h.execute({"say": "hi"}, key="k:1")
    assert r.ok and r.output == {"said": "hi", "key": "k:1"} and r.logs == ["said hi"]
    r = h.execute({"say": "no"})
    assert (r.ok, r.error, r.retryable) == (False, "refused", False)
    assert h.validate({}).error == "say: missing (e.g. say: ...)"
    with pytest.raises(DescribeError, match="version"):
        Harness(type("Bad", (Plugin,), {"name": "bad", "version": "one"}))


def run_harness(path):
    return subprocess.run([sys.executable, "-m", "apollo_plugin.test", path], capture_output=True, env=env(), timeout=60)


def test_the_command_line_harness_passes_a_good_plugin(plug):
    r = run_harness(plug)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    for line in ["ok   runs as a plugin", "ok   validate refuses without text: text: missing",
                 "ok   validate refuses times of the wrong kind", "ok   one effect", "ok   rollback undoes it",
                 "all checks passed"]:
        assert line in out, out


def test_the_command_line_harness_catches_a_second_effect_and_an_undo_that_undoes_nothing(tmp_path):
    counter = PLUGIN.replace("MODE", '"oneshot"').replace(
        'with open(ctx.path(ctx.idempotency_key), "w") as f:', 'with open(ctx.path(ctx.idempotency_key), "a") as f:'
    ).replace("return os.path.exists(ctx.path(ctx.idempotency_key))",
              "p = ctx.path(ctx.idempotency_key)\n        return open(p).read() if os.path.exists(p) else None")
    r = run_harness(write(tmp_path, counter))
    assert r.returncode == 1 and "FAIL one effect: the second execute changed the effect: 'hi' then 'hihi'" in r.stdout.decode()
    keeps = PLUGIN.replace("MODE", '"oneshot"').replace("os.remove(ctx.path(ctx.idempotency_key))", "pass")
    r = run_harness(write(tmp_path, keeps, "keeps.py"))
    assert r.returncode == 1 and "FAIL rollback undoes it: before execute False, after rollback True" in r.stdout.decode()
    loose = PLUGIN.replace("MODE", '"oneshot"').replace('Param("text", "string", required=True)', 'Param("text", "json", required=True)')
    loose = loose.replace('params["text"] * params["times"]', 'str(params["text"]) * params["times"]')
    r = run_harness(write(tmp_path, loose.replace("import os", "import os\nimport sys"), "loose.py"))
    assert "ok   validate refuses without text" in r.stdout.decode()


def test_a_file_that_is_not_executable_is_named(tmp_path, plug):
    os.chmod(plug, 0o644)
    r = run_harness(plug)
    assert r.returncode == 1 and "is not executable (chmod +x" in r.stdout.decode()


def test_execute_must_return_a_dict(tmp_path):
    class Lister(Plugin):
        name, version = "lister", "1.0.0"

        def execute(self, params, ctx):
            return [1, 2]

    r = Harness(Lister).execute({})
    assert r.error == "execute returned a list, expected a dict (the step's output)"


def test_the_shipped_inventory_plugin_passes_the_harness():
    inventory = os.path.join(SDK, "..", "..", "tasks", "plugins", "inventory.py")
    r = run_harness(inventory)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
