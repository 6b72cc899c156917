//! Bad input never takes anything down: malformed definitions and configs
//! get errors naming the file, line and field; malformed frames get JSON-RPC
//! errors; and the agent keeps answering throughout.

use apollo_tests::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// (file name, content, a fragment the error must contain).
fn bad_definitions() -> Vec<(String, String, &'static str)> {
    let mut bomb = String::from("task: bomb\na: &a [x, x, x, x, x, x, x, x, x]\n");
    let mut prev = 'a';
    for n in "bcdefghi".chars() {
        bomb.push_str(&format!(
            "{n}: &{n} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
        prev = n;
    }
    bomb.push_str("steps:\n  - plugin: sleep\n");
    let deep = format!(
        "task: deep\nsteps:\n  - plugin: sleep\n    params:\n      x: {}1{}\n",
        "[".repeat(300),
        "]".repeat(300)
    );
    let huge = format!("task: huge\nsteps:\n  - plugin: sleep\n# {}\n", "x".repeat(1_100_000));
    let s = |x: &str| x.to_string();
    vec![
        (s("empty.yaml"), s(""), "document is empty"),
        (s("scalar.yaml"), s("just a string\n"), "expected a mapping"),
        (s("list.yaml"), s("- a\n- b\n"), "expected a mapping"),
        (s("no_task.yaml"), s("steps:\n  - plugin: sleep\n"), "task: missing field"),
        (s("no_steps.yaml"), s("task: x1\n"), "steps: missing field"),
        (s("empty_steps.yaml"), s("task: x2\nsteps: []\n"), "line 2: steps: is empty"),
        (s("steps_scalar.yaml"), s("task: x3\nsteps: run it\n"), "expected a list of steps"),
        (s("task_list.yaml"), s("task: [a]\nsteps:\n  - plugin: sleep\n"), "line 1: task: expected a string"),
        (s("task_bad_name.yaml"), s("task: \"a b\"\nsteps:\n  - plugin: sleep\n"), "not a valid name"),
        (
            s("unknown_top.yaml"),
            s("task: x4\ncron: '* * * * *'\nsteps:\n  - plugin: sleep\n"),
            "line 2: cron: unknown field \"cron\"",
        ),
        (
            s("unknown_plugin.yaml"),
            s("task: x5\nsteps:\n  - plugin: teleport\n"),
            "line 3: steps[0].plugin: unknown plugin \"teleport\"",
        ),
        (s("plugin_number.yaml"), s("task: x6\nsteps:\n  - plugin: 5\n"), "expected a plugin name"),
        (s("step_no_plugin.yaml"), s("task: x7\nsteps:\n  - name: a\n"), "missing field `plugin`"),
        (s("step_scalar.yaml"), s("task: x8\nsteps:\n  - sleep\n"), "steps[0]: expected a mapping"),
        (
            s("step_unknown.yaml"),
            s("task: x9\nsteps:\n  - plugin: sleep\n    retries: 3\n"),
            "line 4: steps[0].retries: unknown field",
        ),
        (
            s("bad_retry.yaml"),
            s("task: x10\nsteps:\n  - plugin: sleep\n    retry: lots\n"),
            "line 4: steps[0].retry: expected a whole number",
        ),
        (s("neg_retry.yaml"), s("task: x11\nsteps:\n  - plugin: sleep\n    retry: -2\n"), "steps[0].retry"),
        (
            s("bad_timeout.yaml"),
            s("task: x12\nsteps:\n  - plugin: sleep\n    timeout: soon\n"),
            "line 4: steps[0].timeout",
        ),
        (s("zero_timeout.yaml"), s("task: x13\nsteps:\n  - plugin: sleep\n    timeout: 0\n"), "out of range"),
        (
            s("bad_priority.yaml"),
            s("task: x14\npriority: urgent\nsteps:\n  - plugin: sleep\n"),
            "line 2: priority: unknown priority",
        ),
        (s("big_priority.yaml"), s("task: x15\npriority: 1000\nsteps:\n  - plugin: sleep\n"), "out of range"),
        (s("bad_cron.yaml"), s("task: x16\nschedule: '61 * * * *'\nsteps:\n  - plugin: sleep\n"), "line 2: schedule:"),
        (s("cron_words.yaml"), s("task: x17\nschedule: every morning\nsteps:\n  - plugin: sleep\n"), "expected 5"),
        (s("bad_tz.yaml"), s("task: x18\ntimezone: Mars/Base\nsteps:\n  - plugin: sleep\n"), "unknown time zone"),
        (
            s("bad_on_failure.yaml"),
            s("task: x19\non_failure: panic\nsteps:\n  - plugin: sleep\n"),
            "expected rollback, stop or continue",
        ),
        (s("bad_max_active.yaml"), s("task: x20\nmax_active: 0\nsteps:\n  - plugin: sleep\n"), "max_active"),
        (
            s("bad_version.yaml"),
            s("task: x21\nsteps:\n  - plugin: sleep\n    version: latest\n"),
            "not a semver requirement",
        ),
        (
            s("unmatched_version.yaml"),
            s("task: x22\nsteps:\n  - plugin: sleep\n    version: \"^9\"\n"),
            "available: 1.0.0",
        ),
        (
            s("bad_template.yaml"),
            s("task: x23\nsteps:\n  - plugin: sleep\n    params:\n      seconds: \"{{ params.s \"\n"),
            "bad template",
        ),
        (
            s("params_list.yaml"),
            s("task: x24\nsteps:\n  - plugin: sleep\n    params: [1, 2]\n"),
            "expected a mapping of parameters",
        ),
        (
            s("dup_steps.yaml"),
            s("task: x25\nsteps:\n  - {plugin: sleep, name: a}\n  - {plugin: sleep, name: a}\n"),
            "duplicate step name",
        ),
        (s("broken_yaml.yaml"), s("task: x26\nsteps:\n  - plugin: sleep\n    params: {a: 1\n"), "line"),
        (s("tabs.yaml"), s("task: x27\nsteps:\n\t- plugin: sleep\n"), "line 3"),
        (s("binary.yaml"), s("task: x28\u{0}\u{1}\nsteps: \u{7f}\n"), "bin"),
        (s("bomb.yaml"), bomb, "aliases expand too far"),
        (s("deep.yaml"), deep, "nesting is too deep"),
        (s("huge.yaml"), huge, "byte limit"),
        (s("dup_task_a.yaml"), s("task: twin\nsteps:\n  - plugin: sleep\n"), ""),
        (s("dup_task_b.yaml"), s("task: twin\nsteps:\n  - plugin: sleep\n"), "already defined"),
    ]
}

#[test]
fn every_malformed_definition_is_reported_with_its_place_and_the_agent_runs_on() {
    let cases = bad_definitions();
    let mut b = Agent::builder().task("good.yaml", "task: good\nsteps:\n  - plugin: sleep\n");
    for (file, content, _) in &cases {
        b = b.task(file, content);
    }
    let agent = b.start();
    // apollo-agent check lists every problem and exits 1.
    let out = std::process::Command::new(agent_bin())
        .current_dir(agent.path())
        .args(["--tasks", "tasks", "check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    // The running agent shows the same errors in defs.list, and still works;
    // `apollo defs` exits 1 when a definition did not load.
    let (code, defs) = agent.cli_json(&["defs"]);
    assert_eq!(code, 1);
    let defs = defs.as_array().unwrap().clone();
    for (file, _, fragment) in &cases {
        if fragment.is_empty() {
            continue;
        }
        let line = report
            .lines()
            .find(|l| l.contains(&format!("/{file}")))
            .unwrap_or_else(|| panic!("check says nothing of {file}:\n{report}"));
        let fragment = if *fragment == "bin" { "" } else { fragment };
        assert!(line.contains(fragment), "{file}: {line:?} lacks {fragment:?}");
        let d = defs.iter().find(|d| d["file"].as_str().is_some_and(|f| f.ends_with(&format!("/{file}")))).unwrap();
        assert!(d["errors"][0].as_str().unwrap().contains(fragment), "{d:#}");
    }
    assert!(cases.len() >= 30);
    let (code, inst) = agent.cli_json(&["run", "good", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    let (_, alerts) = agent.cli_json(&["alerts", "--limit", "100"]);
    assert!(alerts.as_array().unwrap().iter().any(|a| a["kind"] == "definition_error"));
}

#[test]
fn malformed_configs_are_refused_with_file_line_and_field() {
    let cases: &[(&str, &str)] = &[
        ("scheduler: [1]\n", "scheduler"),
        ("scheduler:\n  concurency: 4\n", "line 2: scheduler: unknown field `concurency`"),
        ("scheduler:\n  concurrency: 0\n", "scheduler.concurrency: 0 is out of range"),
        (
            "scheduler:\n  concurrency: many\n",
            "scheduler.concurrency: expected a whole number of 0 or more, found \"many\"",
        ),
        ("scheduler:\n  lease: forever\n", "scheduler.lease"),
        ("scheduler:\n  zombie_factor: 0.5\n", "zombie_factor"),
        ("database:\n  synchronous: sometimes\n", "database.synchronous"),
        ("database:\n  url: postgresx://db/apollo\n", "database.url: \"postgresx://db/apollo\" is not valid"),
        ("database:\n  schema: Apollo-1\n", "database.schema: \"Apollo-1\" is not valid"),
        ("database:\n  read_url: postgres://replica/apollo\n", "database.read_url: a read replica needs"),
        ("database:\n  password: hunter2\n", "unknown field `password`"),
        ("plugins:\n  - name: x\n    class: apollo.plugins.nope.Nope\n", "unknown class"),
        ("plugins:\n  - name: x\n", "give exactly one of class or command"),
        ("plugins: {a: 1}\n", "plugins"),
        ("logging:\n  format: xml\n", "logging.format"),
        ("logging:\n  level: loud\n", "logging.level"),
        ("socket: [1, 2]\n", "socket"),
        ("tasks: {a: b}\n", "tasks"),
        ("unknown_section: 1\n", "unknown field `unknown_section`"),
        ("a: [1, 2\n", "line"),
        ("database:\n  url: mysql://db/apollo\n", "mysql: is not a store this agent knows (expected sqlite:PATH"),
        ("database:\n  url: postgres://a:secret@db/apollo\n", "the URL holds a password"),
        ("socket:\n  operators: [nosuchuser]\n", "socket.operators[0]: there is no user \"nosuchuser\" on this host"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, (content, fragment)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&path, content).unwrap();
        let out = std::process::Command::new(agent_bin()).arg("--config").arg(&path).arg("check").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "a problem found, as check's help says: {content:?}: {err}");
        assert!(err.contains(&format!("bad{i}.yaml")), "{content:?}: message does not name the file: {err}");
        assert!(err.contains(fragment), "{content:?}: {err:?} lacks {fragment:?}");
    }
    // Every problem of a file at once.
    let path = dir.path().join("many.yaml");
    std::fs::write(
        &path,
        "scheduler:\n  concurrency: 0\nlogging:\n  format: xml\nsocket:\n  observers: [nosuchuser]\n",
    )
    .unwrap();
    let out = std::process::Command::new(agent_bin()).arg("--config").arg(&path).arg("check").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    for fragment in ["scheduler.concurrency: 0", "logging.format: \"xml\"", "socket.observers[0]"] {
        assert!(err.contains(fragment), "{err}");
    }
    // A file of nothing but comments means the defaults.
    let path = dir.path().join("empty.yaml");
    std::fs::write(&path, "# nothing here yet\n").unwrap();
    let out = std::process::Command::new(agent_bin()).arg("--config").arg(&path).arg("check").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("empty"), "{}", String::from_utf8_lossy(&out.stderr));
}

fn ask(stream: &mut UnixStream, reader: &mut BufReader<UnixStream>, frame: &[u8]) -> Value {
    stream.write_all(frame).unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| {
        panic!("reply to {:?} is not JSON ({e}): {line:?}", String::from_utf8_lossy(&frame[..frame.len().min(80)]))
    })
}

#[test]
fn malformed_frames_get_json_rpc_errors_and_the_connection_survives() {
    let agent = Agent::builder().task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n").start();
    let mut stream = UnixStream::connect(&agent.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.list\",\"params\":{{\"x\":\"{}\"}}}}\n",
        "y".repeat(1_100_000)
    );
    let cases: Vec<(Vec<u8>, i64, &str)> = vec![
        (b"not json\n".to_vec(), -32700, "parse error"),
        (b"{\n".to_vec(), -32700, "parse error"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.list\"\n".to_vec(), -32700, "parse error"),
        (b"\xff\xfe\x00garbage\n".to_vec(), -32700, "not UTF-8"),
        (b"\x00\x01\x02\x03\n".to_vec(), -32700, "parse error"),
        (b"42\n".to_vec(), -32600, "found a number"),
        (b"\"hello\"\n".to_vec(), -32600, "found a string"),
        (b"null\n".to_vec(), -32600, "found nothing"),
        (b"true\n".to_vec(), -32600, "found a boolean"),
        (b"[]\n".to_vec(), -32600, "batch requests are not supported"),
        (b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\"}]\n".to_vec(), -32600, "batch"),
        (b"{}\n".to_vec(), -32600, "jsonrpc must be"),
        (b"{\"id\":1,\"method\":\"hello\"}\n".to_vec(), -32600, "jsonrpc must be \"2.0\""),
        (b"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"hello\"}\n".to_vec(), -32600, "jsonrpc must be \"2.0\""),
        (b"{\"jsonrpc\":2,\"id\":1,\"method\":\"hello\"}\n".to_vec(), -32600, "jsonrpc must be"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1}\n".to_vec(), -32600, "method must be a string"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":7}\n".to_vec(), -32600, "method must be a string"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":{\"a\":1},\"method\":\"hello\"}\n".to_vec(), -32600, "id must be"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.destroy\"}\n".to_vec(), -32601, "unknown method \"tasks.destroy\""),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\"}\n".to_vec(), -32601, "unknown method"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.get\",\"params\":[1]}\n".to_vec(), -32602, "params must be an object"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.get\",\"params\":\"x\"}\n".to_vec(), -32602, "params must be an object"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.get\",\"params\":{}}\n".to_vec(), -32602, "missing field `id`"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.get\",\"params\":{\"id\":5}}\n".to_vec(), -32602, "invalid type"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.get\",\"params\":{\"id\":\"nope\"}}\n".to_vec(), -32004, "no instance nope"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.list\",\"params\":{\"state\":\"DONE\"}}\n".to_vec(), -32602, "unknown variant"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.list\",\"params\":{\"limit\":-1}}\n".to_vec(), -32602, "invalid value"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.list\",\"params\":{\"colour\":\"red\"}}\n".to_vec(), -32602, "unknown field `colour`"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.trigger\",\"params\":{\"task\":\"nope\"}}\n".to_vec(), -32004, "no task \"nope\" is defined"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tasks.trigger\",\"params\":{\"task\":\"ok\",\"params\":[1]}}\n".to_vec(), -32602, "invalid type"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\",\"params\":{\"protocol\":99}}\n".to_vec(), -32602, "protocol 99 is not supported"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"subscribe\",\"params\":{\"topics\":[\"gossip\"]}}\n".to_vec(), -32602, "unknown topic"),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"steps.logs\",\"params\":{\"id\":\"x\"}}\n".to_vec(), -32602, "missing field `step`"),
        (big.into_bytes(), -32600, "frame longer than"),
    ];
    assert!(cases.len() >= 30);
    for (frame, code, fragment) in &cases {
        let reply = ask(&mut stream, &mut reader, frame);
        let shown = String::from_utf8_lossy(&frame[..frame.len().min(80)]).to_string();
        assert_eq!(reply["jsonrpc"], "2.0", "{shown}: {reply}");
        assert_eq!(reply["error"]["code"], json!(code), "{shown}: {reply}");
        let msg = reply["error"]["message"].as_str().unwrap();
        assert!(msg.contains(fragment), "{shown}: {msg:?} lacks {fragment:?}");
    }
    // The same connection still answers.
    let ok = ask(&mut stream, &mut reader, b"{\"jsonrpc\":\"2.0\",\"id\":\"last\",\"method\":\"agent.status\"}\n");
    assert_eq!(ok["id"], "last");
    assert_eq!(ok["result"]["definitions"], 1);
    // A half line followed by a hang-up does not hurt the agent.
    let mut s2 = UnixStream::connect(&agent.socket).unwrap();
    s2.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"meth").unwrap();
    drop(s2);
    // Random bytes on a fresh connection, then a valid call.
    let mut s3 = UnixStream::connect(&agent.socket).unwrap();
    let garbage: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    s3.write_all(&garbage).unwrap();
    s3.write_all(b"\n{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"agent.status\"}\n").unwrap();
    s3.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while !text.contains("\"id\":9") {
        let n = s3.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed after garbage: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let (code, _) = agent.cli_json(&["status"]);
    assert_eq!(code, 0, "the agent stopped answering:\n{}", agent.log());
}

const TWO_STEPS: &str = "task: t\nsteps:\n  - name: first\n    plugin: shell\n    params:\n      command: echo hi\n  - name: second\n    plugin: shell\n    params:\n      command: \"echo {{ steps.first.exit_code }}\"\n";

/// A template name that cannot resolve is found when the file is loaded —
/// by check, by a reload (which keeps the version in force and alerts) and
/// in apollo defs — never half-way through a run.
#[tokio::test]
async fn a_template_that_cannot_resolve_is_refused_at_load_and_a_reload_keeps_the_version_in_force() {
    let agent = Agent::builder().task("t.yaml", TWO_STEPS).start();
    let c = agent.client().await;
    c.subscribe(&[Topic::Alerts]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let check = |text: &str| {
        let file = agent.path().join("candidate.yaml");
        std::fs::write(&file, text).unwrap();
        let out = std::process::Command::new(agent_bin()).arg("check").arg(&file).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    let cases = [
        ("{{ steps.first.exit_code }}", "{{ steps.nope.output }}", "line 10: steps[1].params.command: steps.nope: no step \"nope\" runs before this one (earlier steps: first)"),
        ("{{ steps.first.exit_code }}", "{{ steps.first.exitcode }}", "steps.first.exitcode: step \"first\" (shell plugin) gives no output \"exitcode\" (its outputs: exit_code, duration_ms, stdout_tail, result; did you mean \"exit_code\"?)"),
        ("{{ steps.first.exit_code }}", "{{ steps.first.exit_code | uper }}", "unknown filter \"uper\" (did you mean \"upper\"?"),
    ];
    for (good, bad, said) in cases {
        let (code, text) = check(&TWO_STEPS.replace(good, bad));
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains(said), "{bad}: {text}");
    }
    let later = TWO_STEPS.replace("command: echo hi", "command: \"echo {{ steps.second.exit_code }}\"");
    let (_, text) = check(&later);
    assert!(text.contains("steps[0].params.command: steps.second: step \"second\" runs after this one"), "{text}");
    // A reload of the broken file keeps the version in force and says why.
    std::fs::write(
        agent.path().join("tasks/t.yaml"),
        TWO_STEPS.replace("{{ steps.first.exit_code }}", "{{ steps.nope.output }}"),
    )
    .unwrap();
    let alert =
        wait_event(&mut events, "the definition_error alert", |e| e.data.json()["kind"] == "definition_error").await;
    assert!(
        alert.data.json()["message"].as_str().unwrap().contains("no step \"nope\" runs before this one"),
        "{alert:?}"
    );
    let defs = agent.cli(&["defs"]);
    assert_eq!(defs.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&defs.stdout).contains("no step \"nope\""));
    let (code, inst) = agent.cli_json(&["run", "t", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "the version in force runs: {inst:#}");
    // Dry-run sees the same (of the version in force: it is valid).
    let (code, _) = agent.cli_json(&["dry-run", "t"]);
    assert_eq!(code, 0);
}

/// Help that reads like a colleague's: the closest name, a tab called a
/// tab, a plugin's param at step level, serde's words replaced, a cron
/// field named with its range.
#[test]
fn refusals_say_what_was_meant() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let file = dir.path().join("t.yaml");
        std::fs::write(&file, text).unwrap();
        let out = std::process::Command::new(agent_bin())
            .arg("--tasks")
            .arg(dir.path())
            .arg("check")
            .arg(&file)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    let cases: &[(&str, &str)] = &[
        (
            "task: t\nsteps:\n  - plugin: shell\n    parms: {command: ls}\n",
            "line 4: steps[0].parms: unknown field \"parms\" (did you mean \"params\"?",
        ),
        (
            "task: t\nshedule: \"0 6 * * *\"\nsteps:\n  - plugin: sleep\n",
            "unknown field \"shedule\" (did you mean \"schedule\"?",
        ),
        ("task: t\nsteps:\n  - plugin: shel\n", "unknown plugin \"shel\" (did you mean \"shell\"? registered:"),
        (
            "task: t\nsteps:\n\t- plugin: sleep\n",
            "line 3: a tab here: YAML indents with spaces only (replace the tab with spaces)",
        ),
        (
            "task: t\nsteps:\n  - plugin: shell\n    command: ls\n",
            "line 4: steps[0].command: \"command\" is a param of the shell plugin: indent it under params:",
        ),
        (
            "task: t\nschedule: \"61 * * * *\"\nsteps:\n  - plugin: sleep\n",
            "the minute field \"61\" holds 61, out of range (expected *, a value from 0 to 59",
        ),
        (
            "task: t\nsteps:\n  - plugin: sleep\n    retry: four\n",
            "steps[0].retry: expected a whole number of retries from 0 to 100, found \"four\"",
        ),
    ];
    for (text, said) in cases {
        let out = check(text);
        assert!(out.contains(said), "{text:?}:\n{out}");
    }
    // A trigger's parameter, with the closest declared one.
    let agent = Agent::builder().task("p.yaml", "task: p\nparams:\n  host: db1\nsteps:\n  - plugin: sleep\n").start();
    let out = agent.cli(&["run", "p", "-p", "hots=db2"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("task \"p\" has no parameter \"hots\" (did you mean \"host\"? declared: host)"), "{err}");
}
