//! The CLI's contract: exit codes, messages, human output; and the agent's
//! process contract: clean SIGTERM, one agent per data dir, socket mode.

use apollo_tests::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn no_agent_means_exit_2_with_the_socket_tried_and_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nobody.sock");
    let out = std::process::Command::new(cli_bin()).arg("--socket").arg(&sock).arg("status").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&sock.display().to_string()) && err.contains("apollo-agent"), "{err}");
}

#[test]
fn usage_errors_exit_2_and_refusals_exit_1() {
    let agent = Agent::builder().task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n").start();
    assert_eq!(agent.cli(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(agent.cli(&["run", "ok", "-p", "novalue"]).status.code(), Some(2));
    let out = agent.cli(&["run", "missing"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no task \"missing\" is defined (defined: ok)"));
    let out = agent.cli(&["show", "01NOSUCHINSTANCE"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn human_output_is_plain_without_a_terminal_and_shows_steps_and_history() {
    let agent = Agent::builder().bundled_tasks().start();
    let out = agent.cli(&["run", "daily_report", "--wait"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains('\x1b'), "colour codes without a terminal: {text}");
    assert!(text.starts_with("SUCCESS daily_report "), "{text}");
    assert!(text.contains("daily_report.html"), "the report's place is printed: {text}");
    let id = text.split_whitespace().nth(2).unwrap();
    let show = String::from_utf8_lossy(&agent.cli(&["show", id]).stdout).to_string();
    assert!(show.contains("history:") && show.contains("PENDING -> RUNNING"), "{show}");
    let ls = String::from_utf8_lossy(&agent.cli(&["ls"]).stdout).to_string();
    assert!(ls.contains(id) && ls.contains("SUCCESS"), "{ls}");
    let logs = String::from_utf8_lossy(&agent.cli(&["logs", id, "--step", "download"]).stdout).to_string();
    assert!(logs.contains("downloaded file://tasks/data/report.csv"), "{logs}");
    let (code, ls) = agent.cli_json(&["ls", "--state", "success", "--task", "daily_report"]);
    assert_eq!(code, 0);
    assert_eq!(ls.as_array().unwrap().len(), 1);
    let (_, plugins) = agent.cli_json(&["plugins"]);
    let names: Vec<_> = plugins.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    for n in ["data_parser", "file_downloader", "http", "report_generator", "shell", "sleep"] {
        assert!(names.contains(&n), "{names:?}");
    }
    let http = plugins.as_array().unwrap().iter().find(|p| p["name"] == "http").unwrap();
    assert_eq!((http["timeout_secs"].as_f64(), http["retry"].as_u64()), (Some(30.0), Some(3)));
}

#[test]
fn sigterm_lets_the_running_step_finish_and_exits_0() {
    let mut agent = Agent::builder()
        .task(
            "short.yaml",
            "task: short\nsteps:\n  - plugin: shell\n    params:\n      command: sleep 1 && touch done-marker\n",
        )
        .start();
    let out = agent.cli(&["run", "short"]);
    assert_eq!(out.status.code(), Some(0));
    // Wait for the step to start, then stop the agent.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = agent.client().await;
        c.subscribe(&[Topic::Tasks]).await.unwrap();
        let mut ev = c.take_events().unwrap();
        let (_, list) = agent.cli_json(&["ls"]);
        let id = list[0]["id"].as_str().unwrap().to_string();
        wait_until(&c, &mut ev, &id, "the step to run", |i| {
            i.steps.as_ref().unwrap()[0].state == apollo_shared::StepState::Running
        })
        .await;
    });
    let status = agent.stop();
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    let marker = std::fs::read_dir(agent.path().join("data/work"))
        .unwrap()
        .flatten()
        .any(|d| d.path().join("done-marker").exists());
    assert!(marker, "the running step was not allowed to finish:\n{}", agent.log());
    assert!(!agent.socket.exists(), "the socket file was left behind");
}

#[test]
fn a_second_agent_on_the_same_data_dir_is_refused_and_the_socket_is_0660() {
    let agent = Agent::builder().start();
    let mode = std::fs::metadata(&agent.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let out = std::process::Command::new(agent_bin())
        .current_dir(agent.path())
        .args(["--data-dir", "data", "--socket", "other.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another agent") && err.contains("PostgreSQL"), "{err}");
    // The first one is unharmed.
    assert_eq!(agent.cli(&["status"]).status.code(), Some(0));
}

#[test]
fn json_logs_carry_the_task_id_and_trace_id_and_go_to_a_rolling_file() {
    let mut agent = Agent::builder()
        .config("logging:\n  format: json\n  dir: logs\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: shell\n    params:\n      command: echo hi\n")
        .start();
    let (code, inst) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0);
    let (id, trace) = (inst["id"].as_str().unwrap(), inst["trace_id"].as_str().unwrap());
    // The instance's last lines are logged after its end is committed (which
    // is what `--wait` returns on): a stopped agent has written them all.
    assert!(agent.stop().success());
    let stderr = agent.log();
    let lines: Vec<serde_json::Value> = stderr.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(!lines.is_empty(), "stderr is not JSON lines:\n{stderr}");
    let of_instance: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l.to_string().contains("step succeeded") || l.to_string().contains("instance succeeded"))
        .collect();
    assert!(of_instance.len() >= 2, "{stderr}");
    for l in of_instance {
        let span = &l["span"];
        let spans = l["spans"].to_string();
        assert!(span.to_string().contains(id) || spans.contains(id), "no task id in {l}");
        assert!(spans.contains(trace), "no trace id in {l}");
    }
    let files: Vec<_> = std::fs::read_dir(agent.path().join("logs")).unwrap().flatten().collect();
    assert!(!files.is_empty(), "no rolling log file");
}

#[test]
fn peer_credentials_decide_the_role() {
    use std::os::unix::process::CommandExt;
    // 65534 may read; 65533 is nobody the config names.
    let agent = Agent::builder()
        .config("socket:\n  observers: ['65534']\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    // Let other users reach the socket (the agent makes it 0660 for its group).
    std::fs::set_permissions(agent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&agent.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let as_user = |uid: u32, args: &[&str]| {
        std::process::Command::new(cli_bin())
            .arg("--socket")
            .arg(&agent.socket)
            .args(args)
            .uid(uid)
            .gid(uid)
            .output()
            .unwrap()
    };
    let out = as_user(65534, &["--json", "status"]);
    assert_eq!(out.status.code(), Some(0), "an observer may read: {}", String::from_utf8_lossy(&out.stderr));
    let out = as_user(65534, &["run", "ok"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tasks.trigger needs the operator role") && err.contains("is an observer"), "{err}");
    let out = as_user(65533, &["status"]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uid 65533 may not use this agent") && err.contains("socket.operators"), "{err}");
    let (_, list) = agent.cli_json(&["ls"]);
    assert_eq!(list, serde_json::json!([]), "the observer's run created nothing");
}

#[tokio::test]
async fn tasks_list_pages_newest_first_with_a_cursor() {
    let agent = Agent::builder().task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n").start();
    let c = agent.client().await;
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(trigger(&c, "ok", serde_json::json!({})).await);
    }
    made.reverse();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query =
            apollo_shared::protocol::ListParams { limit: Some(2), cursor: cursor.clone(), ..Default::default() };
        let page = c.request::<m::TasksList>(query).await.unwrap();
        seen.extend(page.items.iter().map(|i| i.id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, made, "every instance once, newest first");
}

#[test]
fn completions_and_man_pages_are_generated() {
    let run = |bin: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new(bin).args(args).output().unwrap();
        assert!(out.status.success(), "{} {args:?}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let cli = cli_bin();
    assert!(run(&cli, &["completions", "bash"]).contains("_apollo()"));
    assert!(run(&cli, &["completions", "zsh"]).starts_with("#compdef apollo"));
    // Dynamic: the shell calls back into apollo, which asks the agent.
    assert!(run(&cli, &["completions", "fish"]).contains("--command apollo --arguments \"(COMPLETE=fish"));
    for (bin, args, name) in [
        (cli.clone(), vec!["man"], "apollo"),
        (agent_bin(), vec!["man"], "apollo-agent"),
        (bin_dir().join("apollo-tui"), vec!["--man"], "apollo-tui"),
    ] {
        let page = run(&bin, &args);
        assert!(page.starts_with(".ie") || page.contains(".TH"), "{name}: {page:.200}");
        assert!(page.contains(&format!(".TH {name}")), "{name}: {page:.300}");
    }
}

#[test]
fn the_agent_name_signs_history_and_status_and_a_bad_one_is_refused() {
    let agent = Agent::builder()
        .config("agent:\n  name: db-7\n")
        .task("ok.yaml", "task: ok\nsteps:\n  - plugin: sleep\n")
        .start();
    let (code, inst) = agent.cli_json(&["run", "ok", "--wait"]);
    assert_eq!(code, 0, "{inst}");
    let (_, shown) = agent.cli_json(&["show", inst["id"].as_str().unwrap()]);
    let claimed = shown["transitions"].as_array().unwrap().iter().find(|t| t["reason"] == "claimed").cloned();
    let by = claimed.as_ref().and_then(|t| t["actor"].as_str()).unwrap_or_default().to_string();
    assert_eq!(by, format!("agent:db-7:{}", agent.pid()), "{shown:#}");
    let (_, status) = agent.cli_json(&["status"]);
    assert_eq!(status["agent"], format!("db-7:{}", agent.pid()), "{status:#}");

    let out = std::process::Command::new(agent_bin())
        .current_dir(agent.path())
        .args(["--name", "db 7", "check"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--name: \"db 7\" is not a valid agent name"), "{err}");
}

/// `apollo`'s completion offers the running agent's task names and
/// instance ids, and only the flags, quietly, when no agent answers.
#[test]
fn completion_offers_task_names_and_instance_ids_from_the_agent() {
    let agent = Agent::builder().task("deploy_web.yaml", "task: deploy_web\nsteps:\n  - plugin: sleep\n").start();
    let (_, inst) = agent.cli_json(&["run", "deploy_web", "--wait"]);
    let id = inst["id"].as_str().unwrap().to_string();
    let complete = |socket: &std::path::Path, words: &[&str]| {
        let out = std::process::Command::new(cli_bin())
            .arg("--")
            .args(words)
            .env("COMPLETE", "bash")
            .env("_CLAP_COMPLETE_INDEX", (words.len() - 1).to_string())
            .env("_CLAP_IFS", "\n")
            .env("APOLLO_SOCKET", socket)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
    };
    assert!(complete(&agent.socket, &["apollo", "run", ""]).contains(&"deploy_web".to_string()));
    assert!(complete(&agent.socket, &["apollo", "show", ""]).contains(&id));
    assert!(complete(&agent.socket, &["apollo", "retry", "--task", ""]).contains(&"deploy_web".to_string()));
    let none = complete(std::path::Path::new("/nonexistent/agent.sock"), &["apollo", "run", ""]);
    assert!(none.iter().all(|w| w.starts_with('-')), "only flags without an agent: {none:?}");
    // The registration a shell sources calls back into apollo.
    let reg = agent.cli(&["completions", "bash"]);
    assert!(String::from_utf8_lossy(&reg.stdout).contains("COMPLETE=\"bash\""));
}
