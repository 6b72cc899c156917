//! Sub-runbooks (`task: NAME` on a step): the child instance runs while its
//! parent waits holding no slot, its outcome is the step's, a retry of the
//! parent retries the child from where it failed, a cancel and a rollback of
//! the parent go down to the child, and a cycle is refused at load.

use apollo_shared::state::StepState;
use apollo_tests::*;

/// `deploy` runs `release` (two steps) as its step `ship`, then `announce`.
/// Every step appends to `witness`; every undo to `undone`; the child's
/// second step fails while `broken` exists and waits while `hold` exists.
fn tasks() -> [(&'static str, String); 2] {
    let w = "$APOLLO_WORK_DIR/../..";
    let step = |name: &str, extra: &str| {
        format!(
            "  - name: {name}\n    plugin: shell\n    retry: 0\n    params:\n      command: |\n        {extra}echo {name} >> {w}/witness\n      rollback_command: echo {name} >> {w}/undone\n"
        )
    };
    let check =
        format!("while [ -e {w}/hold ]; do sleep 0.02; done; if [ -e {w}/broken ]; then echo broken >&2; exit 1; fi; ");
    let release = format!(
        "task: release\non_failure: stop\nparams:\n  version: {{required: true}}\nsteps:\n{}{}",
        step("build", ""),
        step("verify", &check)
    );
    let deploy = format!(
        "task: deploy\non_failure: stop\nsteps:\n{}  - name: ship\n    task: release\n    params:\n      version: \"2.1\"\n{}",
        step("prepare", ""),
        step("announce", "")
    );
    [("release.yaml", release), ("deploy.yaml", deploy)]
}

fn agent() -> Agent {
    let [(f1, t1), (f2, t2)] = tasks();
    let agent = Agent::builder().config("scheduler:\n  concurrency: 1\n").task(f1, &t1).task(f2, &t2).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    agent
}

fn child_of(inst: &serde_json::Value) -> String {
    inst["steps"][1]["output"]["instance"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            let e = inst["steps"][1]["error"].as_str()?;
            Some(e.split_whitespace().nth(2)?.to_string())
        })
        .unwrap_or_else(|| panic!("no child named: {inst:#}"))
}

#[test]
fn a_child_runs_while_its_parent_waits_holding_no_slot_and_its_outcome_is_the_step() {
    // One slot: a parent that held it while waiting would never see its child run.
    let agent = agent();
    let (code, inst) = agent.cli_json(&["run", "deploy", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    assert_eq!(data_lines(&agent, "witness"), ["prepare", "build", "verify", "announce"]);
    let child = child_of(&inst);
    let out = &inst["steps"][1]["output"];
    assert_eq!((out["task"].as_str(), out["state"].as_str()), (Some("release"), Some("SUCCESS")), "{out:#}");
    let id = inst["id"].as_str().unwrap();
    let (_, c) = agent.cli_json(&["show", &child]);
    assert_eq!((c["state"].as_str(), c["params"]["version"].as_str()), (Some("SUCCESS"), Some("2.1")), "{c:#}");
    let shown = String::from_utf8_lossy(&agent.cli(&["show", &child]).stdout).to_string();
    assert!(shown.contains(&format!("child of {id} step 1")), "{shown}");
    let shown = String::from_utf8_lossy(&agent.cli(&["show", id]).stdout).to_string();
    assert!(shown.contains(&format!("→ child {child}")), "{shown}");
    // Parked while the child ran, and let go when it ended.
    let history = inst["transitions"].as_array().unwrap();
    assert!(
        history.iter().any(|t| t["reason"].as_str().is_some_and(|r| r.contains("waits for its child"))),
        "{inst:#}"
    );
}

#[test]
fn a_retry_of_the_parent_retries_its_failed_child_from_the_failed_step() {
    let agent = agent();
    std::fs::write(agent.path().join("data/broken"), "").unwrap();
    let (code, inst) = agent.cli_json(&["run", "deploy", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let error = inst["steps"][1]["error"].as_str().unwrap_or_default();
    let child = child_of(&inst);
    assert!(
        error.contains(&format!("child instance {child} (task release) ended FAILED")) && error.contains("broken"),
        "{error}"
    );
    std::fs::remove_file(agent.path().join("data/broken")).unwrap();
    let id = inst["id"].as_str().unwrap();
    let (code, inst) = agent.cli_json(&["retry", id, "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    // The child's build ran once; its verify twice; the parent's prepare once.
    assert_eq!(data_lines(&agent, "witness"), ["prepare", "build", "verify", "announce"]);
    let (_, c) = agent.cli_json(&["show", &child]);
    assert_eq!((c["state"].as_str(), c["attempt"].as_u64()), (Some("SUCCESS"), Some(2)), "{c:#}");
}

#[test]
fn a_cancel_and_a_rollback_of_the_parent_reach_its_child() {
    let agent = agent();
    // Cancelled while the child waits.
    std::fs::write(agent.path().join("data/hold"), "").unwrap();
    let out = agent.cli(&["run", "deploy"]);
    assert!(out.status.success());
    let id = String::from_utf8_lossy(&agent.cli(&["ls", "--task", "deploy", "--ids", "--limit", "1"]).stdout)
        .trim()
        .to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let child = rt.block_on(async {
        let (c, mut events) = agent.watch().await;
        let parked = wait_until(&c, &mut events, &id, "the parent parked", |i| {
            i.waiting.as_deref().is_some_and(|w| w.contains("waits for its child"))
        })
        .await;
        parked.waiting.unwrap().split_whitespace().nth(5).unwrap().to_string()
    });
    let (code, parent) = agent.cli_json(&["cancel", &id, "--reason", "wrong version"]);
    assert_eq!((code, parent["state"].as_str()), (0, Some("FAILED")), "{parent:#}");
    let (_, c) = agent.cli_json(&["show", &child]);
    assert_eq!(c["state"], "FAILED", "{c:#}");
    assert!(c["error"].as_str().unwrap_or_default().contains(&format!("its parent {id} was cancelled")), "{c:#}");
    std::fs::remove_file(agent.path().join("data/hold")).unwrap();

    // Rolled back after its success: the child is undone in full, in order.
    let (code, inst) = agent.cli_json(&["run", "deploy", "--wait"]);
    assert_eq!(code, 0, "{inst:#}");
    let (id, child) = (inst["id"].as_str().unwrap().to_string(), child_of(&inst));
    let (code, inst) = agent.cli_json(&["rollback", &id, "--reason", "bad release", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("ROLLED_BACK")), "{inst:#}");
    assert_eq!(data_lines(&agent, "undone"), ["announce", "verify", "build", "prepare"]);
    let (_, c) = agent.cli_json(&["show", &child]);
    assert_eq!(c["state"], "ROLLED_BACK", "{c:#}");
}

#[test]
fn a_cycle_an_unknown_task_and_a_childs_param_typo_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let write = |f: &str, t: &str| std::fs::write(dir.path().join(f), t).unwrap();
    write("a.yaml", "task: a\nsteps:\n  - name: b\n    task: b\n");
    write("b.yaml", "task: b\nsteps:\n  - name: c\n    task: c\n");
    write("c.yaml", "task: c\nsteps:\n  - name: a\n    task: a\n");
    write("d.yaml", "task: d\nsteps:\n  - name: x\n    task: relese\n");
    write("e.yaml", "task: e\nparams:\n  version: {required: true}\nsteps:\n  - plugin: sleep\n");
    write("f.yaml", "task: f\nsteps:\n  - name: x\n    task: e\n    params:\n      verison: \"1\"\n");
    write("release.yaml", "task: release\nsteps:\n  - plugin: sleep\n");
    let out = std::process::Command::new(agent_bin())
        .current_dir(dir.path())
        .arg("check")
        .arg(dir.path())
        .env_remove("APOLLO_CONFIG")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("a.yaml: line 3: steps[0].task: a cycle of tasks running each other: a → b → c → a"),
        "{said}"
    );
    assert!(
        said.contains("d.yaml: line 3: steps[0].task: no task \"relese\" is defined")
            && said.contains("did you mean \"release\"?"),
        "{said}"
    );
    assert!(said.contains("f.yaml: line 3: steps[0].params.verison: task \"e\" has no parameter \"verison\" (did you mean \"version\"?"), "{said}");
    assert!(said.contains("task \"e\" needs parameter \"version\""), "{said}");
    // Checked alone, a file's children are looked up beside it.
    let out = std::process::Command::new(agent_bin())
        .current_dir(dir.path())
        .arg("check")
        .arg(dir.path().join("d.yaml"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("did you mean \"release\"?") && !said.contains("a.yaml"), "{said}");
}

#[test]
fn a_kill_while_the_child_runs_or_before_it_lets_its_parent_go_loses_nothing() {
    let [(f1, t1), (f2, t2)] = tasks();
    let mut agent =
        Agent::builder().config("scheduler:\n  concurrency: 1\n  lease: 3s\n").task(f1, &t1).task(f2, &t2).start();
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    // Killed while the child's verify waits.
    std::fs::write(agent.path().join("data/hold"), "").unwrap();
    assert!(agent.cli(&["run", "deploy"]).status.success());
    let id = String::from_utf8_lossy(&agent.cli(&["ls", "--task", "deploy", "--ids", "--limit", "1"]).stdout)
        .trim()
        .to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (c, mut events) = agent.watch().await;
        let parked = wait_until(&c, &mut events, &id, "the parent parked", |i| i.waiting.is_some()).await;
        let child = parked.waiting.unwrap().split_whitespace().nth(5).unwrap().to_string();
        // Killed once the child's build is recorded and its verify waits.
        wait_until(&c, &mut events, &child, "the child's verify running", |i| {
            i.steps.as_ref().is_some_and(|s| s[0].state == StepState::Success && s[1].state == StepState::Running)
        })
        .await;
    });
    agent.kill9();
    std::fs::remove_file(agent.path().join("data/hold")).unwrap();
    agent.spawn();
    let inst = rt.block_on(async {
        let (c, mut events) = agent.watch().await;
        wait_until(&c, &mut events, &id, "the parent's end", ended).await
    });
    assert_eq!(inst.state, apollo_shared::state::TaskState::Success, "{inst:?}");
    assert_eq!(data_lines(&agent, "witness"), ["prepare", "build", "verify", "announce"]);

    // Killed between the child's end and its parent's release: the
    // restarted agent lets the parent go.
    agent.kill9();
    agent.spawn_with(&[("FAILPOINTS", "executor.before_parent_release=return")]);
    assert!(agent.cli(&["run", "deploy"]).status.success());
    let status = agent.wait_exit(std::time::Duration::from_secs(60));
    assert!(!status.success() && agent.log().contains("crashing at fail point"), "{}", agent.log());
    agent.spawn();
    let listed = agent.cli(&["ls", "--task", "deploy", "--ids", "--limit", "1"]);
    let id = String::from_utf8_lossy(&listed.stdout).trim().to_string();
    let inst = rt.block_on(async {
        let (c, mut events) = agent.watch().await;
        wait_until(&c, &mut events, &id, "the released parent's end", ended).await
    });
    assert_eq!(inst.state, apollo_shared::state::TaskState::Success, "{inst:?}");
}

#[test]
fn on_postgresql_with_two_agents_a_child_and_its_parent_finish_whichever_agent_runs_them() {
    let schema = PgSchema::new("subtasks");
    let [(f1, t1), (f2, t2)] = tasks();
    // One shared witness directory: the agents' data dirs differ.
    let shared = tempfile::tempdir().unwrap();
    let w = shared.path().display().to_string();
    let (t1, t2) = (t1.replace("$APOLLO_WORK_DIR/../..", &w), t2.replace("$APOLLO_WORK_DIR/../..", &w));
    let agents: Vec<Agent> = ["a", "b"]
        .iter()
        .map(|name| {
            Agent::builder()
                .config(&format!("{}agent:\n  name: {name}\nscheduler:\n  concurrency: 1\n", schema.config()))
                .task(f1, &t1)
                .task(f2, &t2)
                .start()
        })
        .collect();
    std::fs::write(shared.path().join("broken"), "").unwrap();
    let (code, inst) = agents[0].cli_json(&["run", "deploy", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    std::fs::remove_file(shared.path().join("broken")).unwrap();
    let id = inst["id"].as_str().unwrap();
    let (code, inst) = agents[1].cli_json(&["retry", id, "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (0, Some("SUCCESS")), "{inst:#}");
    let witness = std::fs::read_to_string(shared.path().join("witness")).unwrap();
    assert_eq!(witness, "prepare\nbuild\nverify\nannounce\n");
    // The maintenance's release of parents is a statement PostgreSQL runs too.
    let log = agents.iter().map(|a| a.log()).collect::<String>();
    assert!(!log.contains("cannot release parents"), "{log}");
    drop(agents);
}
