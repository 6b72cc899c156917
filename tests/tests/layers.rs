//! The layers of ARCHITECTURE.md, enforced on the agent and the console
//! with the checker in `apollo_tests::layers`: the rules, and a test of the
//! checker itself.

use apollo_tests::layers::*;
use apollo_tests::repo;
use std::collections::BTreeMap;

/// Everything the agent's crate may build on, bottom first; each entry may
/// name those before it and none after (ARCHITECTURE.md, "Layers").
const AGENT_ORDER: &[&str] = &[
    "config",
    "shutdown",
    "bus",
    "logs",
    "secrets",
    "repeats",
    "notify",
    "metrics",
    "telemetry",
    "settings",
    "store",
    "plugins",
    "catalog",
    "timeouts",
    "rollouts",
    "steps",
    "handles",
    "scheduler",
    "triggers",
    "hooks",
    "sources",
    "server",
    "reload",
    "check",
];

/// The store's files that hold no backend's SQL: they name neither
/// `store::sqlite` nor `store::postgres` (ARCHITECTURE.md, "Invariants").
const STORE_SHARED: &[&str] = &[
    "store::db",
    "store::history",
    "store::leases",
    "store::locks",
    "store::model",
    "store::ops",
    "store::pauses",
    "store::read",
    "store::records",
    "store::rows",
    "store::value",
    "store::write",
    "store::writer",
];

#[test]
fn the_agent_imports_only_downward_and_in_no_circle() {
    let mut rules: Vec<Rule> = Vec::new();
    for (i, m) in AGENT_ORDER.iter().enumerate() {
        let above: &'static [&'static str] = Box::leak(AGENT_ORDER[i + 1..].to_vec().into_boxed_slice());
        rules.push((m, above, "a layer names only the layers below it (ARCHITECTURE.md, \"Layers\")"));
    }
    rules.push(("config", &["crate"], "config is data: it imports nothing from the crate"));
    rules.push(("metrics", &["crate"], "metrics is a leaf: its HTTP endpoint lives in server"));
    // The store's shared code reaches a backend only through its driver.
    for shared in STORE_SHARED {
        rules.push((shared, &["store::sqlite", "store::postgres"], "shared store code asks the driver (store/db.rs)"));
    }
    let mut problems = check("agent", &rules);
    // Every module has its place in the order.
    for m in modules(&repo().join("agent/src")).keys().filter(|m| *m != "crate" && !m.contains("::")) {
        if !AGENT_ORDER.contains(&m.as_str()) {
            problems.push(format!(
                "agent/src: module {m} is in no layer: give it its place in AGENT_ORDER and in ARCHITECTURE.md"
            ));
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn the_console_imports_only_downward_and_in_no_circle() {
    let rules: Vec<Rule> = vec![
        ("console::app", &["console::ui", "console::worker"], "the console's model does no IO and draws nothing"),
        ("console::ui", &["console::worker"], "the view draws the model; it does no IO"),
        ("client", &["cli", "console"], "the client library knows no front end"),
        ("cli", &["console"], "the CLI and the console share only the client"),
    ];
    let problems = check("tui", &rules);
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

/// The checker itself: an upward import and a circle, added to a copy of
/// a small tree, are found.
#[test]
fn an_upward_import_or_a_circle_is_named() {
    let text = "use crate::store::Store;\nfn f() { super::b::g(); let x = crate::{a, b::{c, d}}; }\n";
    let paths = paths_at(text, text.find("crate::").unwrap() + 7);
    assert_eq!(paths, ["store::Store"]);
    let i = text.rfind("crate::").unwrap() + 7;
    assert_eq!(paths_at(text, i), ["a", "b::c", "b::d"]);
    let mut mods = BTreeMap::new();
    for (name, text) in [
        ("crate", "pub mod a; pub mod b;"),
        ("a", "use crate::b::Thing; // crate::nothing\nfn f() { let s = \"crate::c\"; }"),
        ("b", "fn g() { super::a::f() }"),
    ] {
        mods.insert(name.to_string(), Module { file: format!("{name}.rs"), text: strip_comments(text) });
    }
    let all = edges(&mods);
    let named: Vec<String> = all.iter().map(|e| format!("{}→{}@{}", e.from, e.to, e.line)).collect();
    assert_eq!(named, ["a→b@1", "b→a@1"], "{all:?}");
    assert_eq!(circles(&mods, &all).len(), 1);
}

/// One shutdown path (`agent/src/shutdown.rs`): what the agent starts for
/// its whole life goes into the one tracker the drain waits for, never onto
/// a bare `tokio::spawn` the shutdown would not see.
#[test]
fn the_agents_long_lived_tasks_are_spawned_into_the_shutdown_tracker() {
    let mut problems = Vec::new();
    for file in ["lib.rs", "bus.rs", "hooks.rs", "sources/mod.rs", "server/mod.rs", "store/pool.rs"] {
        let text = strip_comments(&std::fs::read_to_string(repo().join("agent/src").join(file)).unwrap());
        for (n, line) in text.lines().enumerate() {
            if line.contains("tokio::spawn(") {
                problems
                    .push(format!("agent/src/{file}:{}: a bare tokio::spawn: spawn it with Shutdown::spawn", n + 1));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The longest a source file of the agent, the console or the shared crate
/// may grow (issue 39: what no longer fits in a head is split by
/// responsibility, into child modules where it shares private items).
const MAX_LINES: usize = 450;

#[test]
fn no_source_file_is_longer_than_fits_in_a_head() {
    fn walk(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, usize)>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let n = std::fs::read_to_string(&p).unwrap().lines().count();
                out.push((p, n));
            }
        }
    }
    let mut files = Vec::new();
    for krate in ["agent/src", "tui/src", "shared/src"] {
        walk(&repo().join(krate), &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .filter(|(_, n)| *n > MAX_LINES)
        .map(|(p, n)| format!("{}: {n} lines", p.strip_prefix(repo()).unwrap_or(p).display()))
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines, split by responsibility:\n{}", long.join("\n"));
}
