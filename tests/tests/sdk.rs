//! The Python plugin SDK (sdk/python) under the real agent: one class served
//! in both modes — success, a retry it asks for, a permanent failure located
//! in its file, a rollback, a crash mid-call, a worker whose setup raises —
//! and `apollo-agent plugin new --python` writing a plugin that passes
//! `plugin test`, its own tests and a first run.

use apollo_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A plugin on the SDK, found through the checkout's sdk/python. `MODE` is
/// replaced; `flaky` asks for a retry on its first attempt, `crash` kills
/// its own process on the first attempt, `boom` raises.
const PLUGIN: &str = r#"#!/usr/bin/env python3
import os, signal, sys
sys.path.insert(0, SDK)
from apollo_plugin import Param, Plugin

class Probe(Plugin):
    name = NAME
    version = "1.0.0"
    idempotent = True
    mode = MODE
    params = [Param("text", "string", required=True)]
    example_params = {"text": "ok"}

    def setup(self):
        if os.path.exists(os.path.join(os.environ.get("HOME", "/"), "no-setup")):
            raise RuntimeError("no config file")

    def execute(self, params, ctx):
        mark = ctx.path("attempted-" + ctx.step)
        first = not os.path.exists(mark)
        open(mark, "a").close()
        if params["text"] == "flaky" and first:
            ctx.retry("not yet")
        if params["text"] == "crash" and first:
            os.kill(os.getpid(), signal.SIGKILL)
        if params["text"] == "boom":
            return 1 // 0
        ctx.log("wrote", params["text"], "in", os.environ["APOLLO_STEP"])
        with open(ctx.path(ctx.idempotency_key), "w") as f:
            f.write(params["text"])
        return {"text": params["text"], "attempt": ctx.attempt}

    def rollback(self, params, ctx):
        if os.path.exists(ctx.path(ctx.idempotency_key)):
            os.remove(ctx.path(ctx.idempotency_key))
            ctx.log("removed", ctx.idempotency_key)

if __name__ == "__main__":
    Probe.main()
"#;

fn plugin(name: &str, mode: &str) -> String {
    let sdk = repo().join("sdk/python");
    PLUGIN
        .replace("SDK)", &format!("{:?})", sdk.display().to_string()))
        .replace("NAME", &format!("{name:?}"))
        .replace("MODE", &format!("{mode:?}"))
}

fn task(plugin: &str) -> String {
    format!(
        "task: {plugin}-probe
params:
  text: {{default: \"\"}}
  then: {{default: \"true\"}}
on_failure: rollback
steps:
  - name: first
    plugin: {plugin}
    retry: 2
    params: {{text: \"{{{{ params.text }}}}\"}}
  - name: then
    plugin: shell
    retry: 0
    params: {{command: \"{{{{ params.then }}}}\", rollback_command: \"true\"}}
"
    )
}

fn run(agent: &Agent, task: &str, params: &[&str]) -> (i32, Value) {
    let mut args = vec!["run", task, "--wait"];
    for p in params {
        args.extend(["-p", p]);
    }
    agent.cli_json(&args)
}

fn boom_line() -> usize {
    PLUGIN.lines().position(|l| l.contains("1 // 0")).unwrap() + 1
}

#[test]
fn an_sdk_plugin_serves_both_modes_with_retries_failures_rollbacks_and_crashes() {
    let home = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .config("scheduler:\n  backoff_base: 100ms\n")
        .env("HOME", home.path().to_str().unwrap())
        .plugin("sdkone.py", &plugin("sdkone", "oneshot"))
        .plugin("sdkwork.py", &plugin("sdkwork", "worker"))
        .task("one.yaml", &task("sdkone"))
        .task("work.yaml", &task("sdkwork"))
        .start();
    for (name, file) in [("sdkone", "sdkone.py"), ("sdkwork", "sdkwork.py")] {
        let probe = format!("{name}-probe");
        // Success: the output, and the log line through ctx.log (stderr one-shot,
        // a log reply in worker mode).
        let (code, inst) = run(&agent, &probe, &["text=hello"]);
        assert_eq!(code, 0, "{name}: {inst:#}\n{}", agent.log());
        assert_eq!(inst["steps"][0]["output"], serde_json::json!({"text": "hello", "attempt": 1}), "{name}");
        let id = inst["id"].as_str().unwrap().to_string();
        let log = String::from_utf8_lossy(&agent.cli(&["logs", &id, "--step", "first"]).stdout).to_string();
        assert!(log.contains("wrote hello in first"), "{name}: {log}");

        // A retry the plugin asks for: attempt 2 succeeds, the reason is in the history.
        let (code, inst) = run(&agent, &probe, &["text=flaky"]);
        assert_eq!(code, 0, "{name}: {inst:#}");
        assert_eq!(inst["steps"][0]["output"]["attempt"], 2, "{name}");
        let said = inst["transitions"].to_string();
        assert!(said.contains("not yet"), "{name}: the retry's reason: {said}");

        // A bug: permanent (retry: 2 is not used), with type, message and line.
        let (code, inst) = run(&agent, &probe, &["text=boom"]);
        assert_eq!(code, 1, "{name}: {inst:#}");
        let error = inst["steps"][0]["error"].as_str().unwrap_or_default();
        let at = format!("ZeroDivisionError: integer division or modulo by zero (at {file}:{})", boom_line());
        assert!(error.contains(&at), "{name}: {error}");
        assert_eq!(inst["steps"][0]["attempts"], 1, "{name}: a permanent failure is not retried: {inst:#}");

        // A crash mid-call: retried, and the second attempt succeeds.
        let (code, inst) = run(&agent, &probe, &["text=crash"]);
        assert_eq!(code, 0, "{name}: {inst:#}\n{}", agent.log());
        assert_eq!(inst["steps"][0]["output"]["attempt"], 2, "{name}");
        assert!(inst["transitions"].to_string().contains("SIGKILL"), "{name}: {inst:#}");

        // A later step fails: the plugin's rollback undoes its file.
        let (code, inst) = run(&agent, &probe, &["text=undo-me", "then=false"]);
        assert_eq!((code, inst["state"].as_str()), (1, Some("ROLLED_BACK")), "{name}: {inst:#}");
        let key = format!("{}:0", inst["id"].as_str().unwrap());
        let work = agent.path().join("data/work").join(inst["id"].as_str().unwrap());
        assert!(work.join("attempted-first").exists(), "{name}: it ran in {}", work.display());
        assert!(!work.join(&key).exists(), "{name}: the rollback removed {key}");
    }
}

#[test]
fn a_worker_whose_setup_raises_fails_its_step_with_the_message() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("no-setup"), "").unwrap();
    let agent = Agent::builder()
        .config("scheduler:\n  backoff_base: 100ms\n")
        .env("HOME", home.path().to_str().unwrap())
        .plugin("sdkwork.py", &plugin("sdkwork", "worker"))
        .task("work.yaml", &task("sdkwork"))
        .start();
    let (code, inst) = run(&agent, "sdkwork-probe", &["text=hello"]);
    assert_eq!(code, 1, "{inst:#}");
    let error = inst["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("the worker stopped: RuntimeError: no config file (at sdkwork.py:"), "{error}");
}

/// A virtualenv whose python3 finds the checkout's SDK (as `pip install -e`
/// would), for the agent's PATH: the plugin's `#!/usr/bin/env python3`
/// then imports `apollo_plugin` as an author's installed one does.
fn sdk_venv(dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    let made = std::process::Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv).status();
    assert!(made.is_ok_and(|s| s.success()), "python3 -m venv (Debian: python3-venv)");
    let out = std::process::Command::new(venv.join("bin/python"))
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        .output()
        .unwrap();
    let site = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    std::fs::write(site.join("apollo_plugin_sdk.pth"), format!("{}\n", repo().join("sdk/python").display())).unwrap();
    venv.join("bin")
}

#[test]
fn plugin_new_writes_a_python_plugin_that_passes_plugin_test_its_tests_and_a_first_run() {
    let tools = tempfile::tempdir().unwrap();
    let bin = sdk_venv(tools.path());
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let builder = Agent::builder()
        .env("PATH", &path)
        .task("note.yaml", "task: note\nsteps:\n  - plugin: greet_host\n    params: {note: hello}\n");
    let plugins = builder.path().join("tasks/plugins");
    let new = std::process::Command::new(agent_bin())
        .args(["plugin", "new", "greet_host", "--python", "--dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&new.stdout).to_string();
    assert!(new.status.success(), "{said}{}", String::from_utf8_lossy(&new.stderr));
    assert!(said.contains("apollo-agent plugin test") && said.contains("test_greet_host.py"), "{said}");
    let file = plugins.join("greet_host.py");
    // Never overwritten; a name that cannot be a file name is refused.
    let again = std::process::Command::new(agent_bin())
        .args(["plugin", "new", "greet_host", "--python", "--dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists; plugin new never overwrites"));
    let bad =
        std::process::Command::new(agent_bin()).args(["plugin", "new", "Greet Host", "--python"]).output().unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("lower-case letters, digits, _ and -"));

    // The agent's checks, the SDK's harness and the generated tests pass as written.
    let kit = std::process::Command::new(agent_bin())
        .args(["plugin", "test"])
        .arg(&file)
        .env("PATH", &path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&kit.stdout).to_string();
    assert!(kit.status.success() && text.contains("all checks passed"), "{text}");
    let harness = std::process::Command::new(bin.join("python3"))
        .args(["-m", "apollo_plugin.test"])
        .arg(&file)
        .env("PATH", &path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&harness.stdout).to_string();
    assert!(harness.status.success(), "{text}{}", String::from_utf8_lossy(&harness.stderr));
    for check in ["ok   validate refuses bad_examples[0]", "ok   one effect", "ok   rollback undoes it"] {
        assert!(text.contains(check), "{text}");
    }
    let own = std::process::Command::new(bin.join("python3")).arg(plugins.join("test_greet_host.py")).output().unwrap();
    assert!(own.status.success(), "{}{}", String::from_utf8_lossy(&own.stdout), String::from_utf8_lossy(&own.stderr));

    // The agent registers it (and not its tests) and runs it.
    let agent = builder.start();
    let (code, inst) = agent.cli_json(&["run", "note", "--wait"]);
    assert_eq!(code, 0, "{inst:#}\n{}", agent.log());
    let out = inst["steps"][0]["output"]["path"].as_str().unwrap().to_string();
    assert_eq!(std::fs::read_to_string(out).unwrap(), "hello\n");
    let (_, listed) = agent.cli_json(&["plugins"]);
    assert!(!listed.to_string().contains("test_greet_host"), "{listed:#}");
}
