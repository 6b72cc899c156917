//! Fan-out steps (`foreach:`): the rolling restart of 40 hosts — one canary,
//! then a quarter, then the rest — with a failure budget of 2, on the real
//! agent. A witness file per run says which items ran and how often; the
//! items' own ledger rows say what the agent recorded.

use apollo_tests::*;
use serde_json::Value;
use std::collections::BTreeMap;

fn hosts(n: usize) -> String {
    (0..n).map(|i| format!("web-{i:02}")).collect::<Vec<_>>().join(", ")
}

/// The rolling restart: each item appends its host to `witness` and fails
/// while `fail-<host>` exists; its undo appends to `undone`.
pub(crate) fn rolling(n: usize, extra: &str) -> String {
    let w = "$APOLLO_WORK_DIR/../..";
    format!(
        r#"task: rolling
params:
  hosts: {{default: [{hosts}]}}
steps:
  - name: restart
    plugin: shell
    retry: 0
    on_failure: stop
    foreach: "{{{{ params.hosts }}}}"
    as: host
    batches: [1, "25%", "100%"]
    max_failures: 2
{extra}    params:
      command: echo restarting {{{{ host }}}}; echo {{{{ host }}}} >> {w}/witness; echo $APOLLO_IDEMPOTENCY_KEY >> {w}/keys; test ! -e {w}/fail-{{{{ host }}}}
      rollback_command: echo {{{{ host }}}} >> {w}/undone; echo $APOLLO_IDEMPOTENCY_KEY >> {w}/undone-keys
  - name: after
    plugin: shell
    params:
      command: "echo {{{{ steps.restart.ok }}}} of {{{{ steps.restart.total }}}}"
      rollback_command: "true"
"#,
        hosts = hosts(n)
    )
}

pub(crate) fn counts(lines: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in lines {
        *m.entry(l.clone()).or_insert(0) += 1;
    }
    m
}

/// The items of the instance's first fan-out step, as `show --items --json` gives them.
fn items(agent: &Agent, id: &str) -> Vec<Value> {
    let (code, doc) = agent.cli_json(&["show", id, "--items"]);
    assert_eq!(code, 0, "{doc:#}");
    doc[0]["items"].as_array().cloned().unwrap_or_default()
}

fn fail(agent: &Agent, hosts: &[&str]) {
    for h in hosts {
        std::fs::write(agent.path().join("data").join(format!("fail-{h}")), "").unwrap();
    }
}

fn heal(agent: &Agent, hosts: &[&str]) {
    for h in hosts {
        let _ = std::fs::remove_file(agent.path().join("data").join(format!("fail-{h}")));
    }
}

#[test]
fn three_failures_over_a_budget_of_two_stop_the_step_and_a_retry_runs_only_the_rest() {
    let agent =
        Agent::builder().config("scheduler:\n  concurrency: 4\n").task("rolling.yaml", &rolling(40, "")).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    let bad = ["web-07", "web-12", "web-31"];
    fail(&agent, &bad);
    let (code, inst) = agent.cli_json(&["run", "rolling", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let error = inst["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("3 of 40 items failed (budget 2): web-07, web-12, web-31"), "{error}");
    let id = inst["id"].as_str().unwrap().to_string();
    let ran = counts(&data_lines(&agent, "witness"));
    assert!(ran.values().all(|n| *n == 1), "an item ran twice: {ran:?}");
    let first = items(&agent, &id);
    assert_eq!(first.len(), 40);
    // Exactly the items that never ran are recorded as not started, with the reason.
    for it in &first {
        let label = it["label"].as_str().unwrap();
        let state = it["state"].as_str().unwrap();
        match ran.contains_key(label) {
            true => assert!(state == "SUCCESS" || state == "FAILED", "{it:#}"),
            false => {
                assert_eq!(state, "PENDING", "{it:#}");
                let why = it["error"].as_str().unwrap_or_default();
                assert!(why.contains("not started: 3 of 40 items failed, over the failure budget of 2"), "{it:#}");
            }
        }
        assert_eq!(it["state"] == "FAILED", bad.contains(&label), "{it:#}");
    }
    let not_started = first.iter().filter(|i| i["state"] == "PENDING").count();
    // Items start in list order: the never-started ones are the list's tail,
    // all after web-31, the third failure (how many depends on what was
    // running beside it: 4 at once).
    assert!((1..=8).contains(&not_started), "{not_started} not started");
    let tail = &first[40 - not_started..];
    assert!(tail.iter().all(|i| i["state"] == "PENDING"), "not a tail: {first:#?}");
    assert!(first[..=31].iter().all(|i| i["state"] != "PENDING"), "{first:#?}");
    // The canary ran alone, before everything else.
    assert_eq!(data_lines(&agent, "witness")[0], "web-00");
    let shown = String::from_utf8_lossy(&agent.cli(&["show", &id]).stdout).to_string();
    assert!(shown.contains(&format!("batch 3/3  {} of 40 items", 40 - 3 - not_started)), "{shown}");

    // The retry runs the failed and the not-started items, nothing else.
    heal(&agent, &bad);
    let (code, inst) = agent.cli_json(&["retry", &id, "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    let ran = counts(&data_lines(&agent, "witness"));
    assert_eq!(ran.len(), 40, "{ran:?}");
    for (host, n) in &ran {
        assert_eq!(*n, if bad.contains(&host.as_str()) { 2 } else { 1 }, "{host} ran {n} times: {ran:?}");
    }
    let out = &inst["steps"][0]["output"];
    assert_eq!((out["ok"].as_u64(), out["failed"].as_array().map(Vec::len)), (Some(40), Some(0)), "{out:#}");
    assert_eq!(out["items"].as_array().map(Vec::len), Some(40));
    assert_eq!(inst["steps"][1]["output"]["stdout_tail"].as_str().map(str::trim), Some("40 of 40"), "{inst:#}");

    // The rollback undoes every item, the last to end first.
    let (code, inst) = agent.cli_json(&["rollback", &id, "--reason", "test", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("ROLLED_BACK")), "{inst:#}");
    let mut done: Vec<(u64, String)> = items(&agent, &id)
        .iter()
        .map(|i| (i["done"].as_u64().unwrap(), i["label"].as_str().unwrap().to_string()))
        .collect();
    done.sort();
    let expected: Vec<String> = done.into_iter().rev().map(|(_, l)| l).collect();
    assert_eq!(data_lines(&agent, "undone"), expected);
    // Each undo has its item's key: the one its execute had.
    let (keys, undone) = (data_lines(&agent, "keys"), data_lines(&agent, "undone-keys"));
    assert_eq!(undone.len(), 40);
    assert!(undone.iter().all(|k| keys.contains(k) && k.contains(":web-")), "{undone:?}");
    assert!(items(&agent, &id).iter().all(|i| i["state"] == "ROLLED_BACK"));
}

#[test]
fn within_the_budget_the_step_succeeds_with_its_failed_items_named() {
    let agent =
        Agent::builder().config("scheduler:\n  concurrency: 4\n").task("rolling.yaml", &rolling(10, "")).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    fail(&agent, &["web-03"]);
    let (code, inst) = agent.cli_json(&["run", "rolling", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    let out = &inst["steps"][0]["output"];
    assert_eq!(out["failed"], serde_json::json!(["web-03"]), "{out:#}");
    assert_eq!(out["items"][3], Value::Null);
    assert_eq!(inst["steps"][1]["output"]["stdout_tail"].as_str().map(str::trim), Some("9 of 10"), "{inst:#}");
    // Each item's log is its own.
    let id = inst["id"].as_str().unwrap();
    let log = agent.cli(&["logs", id, "--step", "restart", "--item", "web-03"]);
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(text.contains("item 3 (web-03)") && text.contains("restarting web-03\n"), "{text}");
    assert!(!text.contains("web-02"), "{text}");
    let wrong = agent.cli(&["logs", id, "--step", "restart", "--item", "web-3"]);
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success() && said.contains("no item") && said.contains("web-03"), "{said}");
}

#[test]
fn a_kill_in_the_middle_of_a_batch_runs_no_succeeded_item_again() {
    // Each item takes a moment, so the kill lands with items running.
    let slow = "    max_parallel: 3\n";
    let yaml = rolling(24, slow).replace("test ! -e", "sleep 0.2; test ! -e");
    let mut agent = Agent::builder().config("scheduler:\n  concurrency: 4\n").task("rolling.yaml", &yaml).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    let id = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let (c, mut events) = agent.watch().await;
            let id = trigger(&c, "rolling", serde_json::json!({})).await;
            // Until some items of the last batch have succeeded.
            wait_until(&c, &mut events, &id, "items of batch 3", |i| {
                i.steps.as_ref().and_then(|s| s[0].items.clone()).is_some_and(|n| n.batch == 3 && n.ok >= 10)
            })
            .await;
            id
        })
    };
    let before = items(&agent, &id);
    agent.kill9();
    let succeeded: Vec<String> =
        before.iter().filter(|i| i["state"] == "SUCCESS").map(|i| i["label"].as_str().unwrap().to_string()).collect();
    assert!(succeeded.len() >= 10, "{before:#?}");
    agent.spawn();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let inst = rt.block_on(async {
        let (c, mut events) = agent.watch().await;
        wait_until(&c, &mut events, &id, "the resumed instance", ended).await
    });
    assert_eq!(inst.state, apollo_shared::state::TaskState::Success, "{inst:?}");
    let ran = counts(&data_lines(&agent, "witness"));
    assert_eq!(ran.len(), 24, "{ran:?}");
    for host in &succeeded {
        assert_eq!(ran[host], 1, "{host} succeeded before the kill and ran again: {ran:?}");
    }
    // Those cut off by the kill ran again, and no more than that.
    assert!(ran.values().all(|n| *n <= 2), "{ran:?}");
}

/// `apollo-agent check FILE`.
pub(crate) fn check(file: &std::path::Path) -> std::process::Output {
    std::process::Command::new(agent_bin())
        .current_dir(file.parent().unwrap())
        .arg("check")
        .arg(file)
        .env_remove("APOLLO_CONFIG")
        .env_remove("APOLLO_SOCKET")
        .output()
        .unwrap()
}

#[test]
fn bad_fan_outs_are_refused_at_load_naming_the_field() {
    let agent = Agent::builder().start();
    let cases = [
        ("foreach: 5", "steps[0].foreach", "expected a list of items"),
        ("foreach: [a, b]\n    as: task", "steps[0].as", "a name templates have already"),
        ("foreach: [a, b, c]\n    batches: [1, 1]", "steps[0].batches", "cover 2 of the 3 items"),
        ("foreach: [a]\n    max_failures: -1", "steps[0].max_failures", "expected a count of failures"),
        ("batches: [1]", "steps[0].batches", "goes with `foreach:`"),
    ];
    for (fields, field, says) in cases {
        let yaml = format!("task: bad\nsteps:\n  - name: s\n    plugin: sleep\n    {fields}\n");
        let file = agent.path().join("bad.yaml");
        std::fs::write(&file, &yaml).unwrap();
        let out = check(&file);
        let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(field) && said.contains(says), "{yaml}\n{said}");
        assert!(said.contains("line "), "{said}");
    }
    // The item's name is known in the step's params, and nowhere else.
    let yaml = "task: bad\nsteps:\n  - name: s\n    plugin: shell\n    foreach: [a]\n    as: host\n    params:\n      command: echo {{ hots }}\n";
    let file = agent.path().join("typo.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = check(&file);
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("hots"), "{said}");
}

#[test]
fn a_foreach_that_renders_no_list_fails_naming_what_it_gave_and_an_empty_one_succeeds() {
    let yaml = "task: fan\non_failure: stop\nparams:\n  hosts: {default: []}\nsteps:\n  - name: s\n    plugin: sleep\n    foreach: \"{{ params.hosts }}\"\n";
    let agent = Agent::builder().task("fan.yaml", yaml).start();
    let (code, inst) = agent.cli_json(&["run", "fan", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    assert_eq!(inst["steps"][0]["output"]["total"], 0, "{inst:#}");
    let (code, inst) = agent.cli_json(&["run", "fan", "--param", "hosts=web-01", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let error = inst["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("foreach: rendered a string, not a list: \"web-01\""), "{error}");
}

#[tokio::test]
async fn on_postgresql_a_dead_agents_fan_out_is_taken_over_and_no_item_runs_twice() {
    let schema = PgSchema::new("fanout");
    let shared = tempfile::tempdir().unwrap();
    let witness = shared.path().join("witness");
    let items: Vec<String> = (0..100).map(|i| format!("i{i:03}")).collect();
    let task = format!(
        "task: fleet\nsteps:\n  - name: each\n    plugin: shell\n    foreach: [{}]\n    max_parallel: 4\n    params:\n      \
         command: echo \"start $APOLLO_IDEMPOTENCY_KEY $(date +%s%N)\" >> {w}; sleep 0.05; echo \"end $APOLLO_IDEMPOTENCY_KEY\" >> {w}\n",
        items.join(", "),
        w = witness.display()
    );
    let config = "scheduler:\n  concurrency: 4\n  lease: 2s\n";
    let mut agents: Vec<Agent> = ["a", "b"]
        .iter()
        .map(|name| {
            Agent::builder()
                .config(&format!("{}agent:\n  name: {name}\n{config}", schema.config()))
                .task("fleet.yaml", &task)
                .start()
        })
        .collect();
    let c = agents[0].client().await;
    c.subscribe(&[apollo_shared::protocol::Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let id = trigger(&c, "fleet", serde_json::json!({})).await;
    let at_work = wait_until(&c, &mut events, &id, "20 items done", |i| {
        i.steps.as_ref().and_then(|s| s[0].items.clone()).is_some_and(|n| n.ok >= 20)
    })
    .await;
    let holder = at_work.lease_owner.clone().unwrap_or_default();
    let (dead, alive) = if holder.starts_with("agent:a:") { (0, 1) } else { (1, 0) };
    let succeeded: Vec<String> = schema
        .sql(&format!("SELECT label FROM step_items WHERE instance_id = '{id}' AND state = 'SUCCESS'"))
        .into_iter()
        .map(|r| r[0].clone().unwrap())
        .collect();
    agents[dead].kill9();
    let killed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let c = agents[alive].client().await;
    c.subscribe(&[apollo_shared::protocol::Topic::Tasks]).await.unwrap();
    let mut events = c.take_events().unwrap();
    let done = wait_until(&c, &mut events, &id, "the taken-over fan-out", ended).await;
    assert_eq!(done.state, apollo_shared::state::TaskState::Success, "{done:?}");
    assert_eq!(done.steps.as_ref().unwrap()[0].items.as_ref().map(|n| n.ok), Some(100));
    let lines: Vec<String> = std::fs::read_to_string(&witness).unwrap().lines().map(str::to_string).collect();
    for label in &items {
        let key = format!("{id}:0:{}:{label}", label[1..].parse::<u32>().unwrap());
        let starts: Vec<u128> =
            lines.iter().filter_map(|l| l.strip_prefix(&format!("start {key} "))).map(|t| t.parse().unwrap()).collect();
        // An item recorded SUCCESS before the kill never ran again.
        let limit = if succeeded.contains(label) { 1 } else { 2 };
        assert!((1..=limit).contains(&starts.len()), "item {label} started {} times: {lines:#?}", starts.len());
        // A second run began after the first agent was dead (its runs died
        // with it): no two runs of one item at once.
        if let [first, second] = starts[..] {
            assert!(
                first < killed && second > killed,
                "item {label}: runs at {first} and {second}, killed at {killed}"
            );
        }
        let ends = lines.iter().filter(|l| **l == format!("end {key}")).count();
        assert!((1..=starts.len()).contains(&ends), "item {label} ended {ends} times: {lines:#?}");
    }
    let taken = schema
        .sql(&format!("SELECT COUNT(*) FROM transitions WHERE instance_id = '{id}' AND reason LIKE 'recovered%'"));
    assert_ne!(taken[0][0].as_deref(), Some("0"), "the instance was taken over");
    drop(agents);
}

#[test]
fn the_console_shows_a_fan_out_steps_item_counts_in_its_timeline() {
    let agent =
        Agent::builder().config("scheduler:\n  concurrency: 4\n").task("rolling.yaml", &rolling(10, "")).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    fail(&agent, &["web-03", "web-04", "web-05"]);
    let (code, inst) = agent.cli_json(&["run", "rolling", "--wait"]);
    assert_eq!(code, 1, "{inst:#}");
    let sock = agent.socket.display().to_string();
    let mut c = apollo_tests::console::Console::start_sized(agent.path(), &["--socket", &sock], None, &[], (24, 100));
    c.wait_for(&["connected", "<tasks>", "rolling"]);
    c.keys("\r");
    let screen = c.wait_for(&["<timeline>", "items: batch 3/3"]);
    assert!(screen.contains("0 restart") && screen.contains("3 failed"), "{screen}");
    // The step's items pane: each item by index and label with its state;
    // Enter opens one (its error, output, params, history).
    c.keys("\r");
    c.wait_for(&["<step>", "step 0 restart"]);
    c.keys("\t\t\t\t\t");
    c.wait_for(&["items (Tab", "#3 web-03: FAILED", "#0 web-00: SUCCESS"]);
    // Folded one line each; Enter on web-03 opens it: its error, its history.
    c.keys("jjjjj\r");
    c.wait_for(&["error: \"command ended with exit code 1", "RUNNING → FAILED"]);
    assert_eq!(c.quit(), 0);
}

#[test]
fn a_dry_run_lists_the_items_and_the_batches_it_would_run() {
    let agent = Agent::builder().task("rolling.yaml", &rolling(40, "")).start();
    let out = agent.cli(&["dry-run", "rolling"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("items: 40 in 3 batch(es) (1, 10, 29), failure budget 2, up to 29 at once: web-00, web-01"),
        "{text}"
    );
    // The params shown are the first item's.
    assert!(text.contains("echo restarting web-00;"), "{text}");
    let (_, r) = agent.cli_json(&["dry-run", "rolling", "-p", "hosts=web-01"]);
    let problem = r["steps"][0]["fanout"]["problem"].as_str().unwrap_or_default();
    assert!(problem.contains("not a list"), "{r:#}");
}

#[test]
fn each_item_has_its_secrets_masked_its_own_timeout_and_the_item_limit_holds() {
    let yaml = r#"task: fan
on_failure: stop
params:
  hosts: {default: [a, slow, b]}
secrets:
  token: {env: APOLLO_E2E_FAN_TOKEN}
steps:
  - name: each
    plugin: shell
    retry: 0
    timeout: 2s
    foreach: "{{ params.hosts }}"
    as: host
    max_failures: 1
    params:
      command: 'echo "{{ host }} with {{ secrets.token }}"; if [ {{ host }} = slow ]; then sleep 30; fi'
"#;
    let agent = Agent::builder()
        .env("APOLLO_E2E_FAN_TOKEN", "s3cr3t-fan-value")
        .config("scheduler:\n  max_items: 3\n")
        .task("fan.yaml", yaml)
        .start();
    let (code, inst) = agent.cli_json(&["run", "fan", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    assert_eq!(inst["steps"][0]["output"]["failed"], serde_json::json!(["slow"]), "{inst:#}");
    let id = inst["id"].as_str().unwrap();
    let (_, doc) = agent.cli_json(&["show", id, "--items"]);
    let text = doc.to_string();
    assert!(!text.contains("s3cr3t-fan-value") && text.contains("with ***"), "{text}");
    let slow = &doc[0]["items"][1];
    assert!(slow["error"].as_str().unwrap_or_default().contains("timed out after 2s"), "{slow:#}");
    let log = String::from_utf8_lossy(&agent.cli(&["logs", id, "--step", "each", "--item", "a"]).stdout).to_string();
    assert!(log.contains("a with ***") && !log.contains("s3cr3t"), "{log}");
    // More items than scheduler.max_items: refused when the step starts, naming the limit.
    let (code, inst) = agent.cli_json(&["run", "fan", "--param", r#"hosts=["a","b","c","d"]"#, "--wait"]);
    assert_eq!(code, 1, "{inst:#}");
    let error = inst["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("4 items is more than scheduler.max_items (3) allows"), "{error}");
}
