//! An operator's hand on one item of a fan-out: `apollo skip ID STEP
//! --item LABEL` records a failed (or never started) item SKIPPED with who
//! and why; a retry then runs the items left, never that one, and the step
//! names it under `skipped`.

use super::fanout::{counts, rolling};
use apollo_tests::*;

fn said(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_skipped_item_never_runs_again_and_a_retry_runs_the_rest() {
    let agent = Agent::builder().config("scheduler:\n  concurrency: 4\n").task("rolling.yaml", &rolling(8, "")).start();
    let data = agent.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for h in ["web-02", "web-03", "web-04"] {
        std::fs::write(data.join(format!("fail-{h}")), "").unwrap();
    }
    let (code, inst) = agent.cli_json(&["run", "rolling", "--wait"]);
    assert_eq!((code, inst["state"].as_str()), (1, Some("FAILED")), "{inst:#}");
    let id = inst["id"].as_str().unwrap().to_string();

    // A succeeded item, an unknown one and a running instance's are refused.
    let out = agent.cli(&["skip", &id, "restart", "--item", "web-00", "--reason", "x"]);
    assert!(!out.status.success() && said(&out).contains("cannot be skipped"), "{}", said(&out));
    let out = agent.cli(&["skip", &id, "restart", "--item", "web-3", "--reason", "x"]);
    assert!(!out.status.success() && said(&out).contains("did you mean \"web-03\""), "{}", said(&out));

    let out = agent.cli(&["skip", &id, "restart", "--item", "web-03", "--reason", "decommissioned"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("item web-03 skipped"), "{}", said(&out));
    let (_, shown) = agent.cli_json(&["show", &id]);
    assert_eq!(shown["state"], "FAILED", "the instance waits for a retry");
    assert_eq!(shown["steps"][0]["items"]["skipped"], 1, "{shown:#}");
    let (_, doc) = agent.cli_json(&["show", &id, "--items"]);
    let item = doc[0]["items"].as_array().unwrap().iter().find(|i| i["label"] == "web-03").unwrap().clone();
    assert_eq!(item["state"], "SKIPPED", "{item:#}");
    assert!(item["history"].to_string().contains("skipped by hand: decommissioned"), "{item:#}");
    let (_, audit) = agent.cli_json(&["audit"]);
    let row = audit.as_array().unwrap().iter().find(|r| r["reason"].as_str().unwrap_or("").contains("web-03"));
    assert!(row.is_some_and(|r| r["actor"].as_str().unwrap().ends_with("(uid 0)")), "{audit:#}");

    // The others mended, a retry runs what is left and never web-03.
    for h in ["web-02", "web-04"] {
        std::fs::remove_file(data.join(format!("fail-{h}"))).unwrap();
    }
    let before = counts(&data_lines(&agent, "witness"));
    let out = agent.cli(&["retry", &id, "--wait", "--reason", "mended web-02 and web-04"]);
    assert!(out.status.success(), "{}", said(&out));
    let (_, done) = agent.cli_json(&["show", &id]);
    assert_eq!(done["state"], "SUCCESS", "{done:#}");
    let after = counts(&data_lines(&agent, "witness"));
    assert_eq!(after.get("web-03"), before.get("web-03"), "the skipped item did not run again");
    assert_eq!(done["steps"][0]["output"]["skipped"], serde_json::json!(["web-03"]), "{done:#}");
    assert_eq!(done["steps"][0]["output"]["failed"], serde_json::json!([]), "{done:#}");
}
