//! Task affinity (the original design's §5.3: the shard key is the task):
//! in a queue with `affinity: task`, every instance of a task is claimed by
//! one agent, the live agent serving the queue with the highest rendezvous
//! score for the task. When that agent stops, misses heartbeats for half a
//! lease, or agents join, the owner of each task is recomputed by every
//! agent alike from the agents table: only the tasks of the agent that left
//! (or the share a newcomer wins) move.
//!
//! Affinity places work; it does not exclude: during a change of owner two
//! agents may each hold an instance of a task (an ordered queue keeps one
//! at a time).

use super::db::Db;
use super::Result;
use sha2::{Digest, Sha256};

/// A task's rendezvous score on an agent: the first eight bytes of
/// SHA-256 over both names, the same on every agent and every build.
pub fn score(agent: &str, task: &str) -> u64 {
    let digest =
        Sha256::new().chain_update(agent.as_bytes()).chain_update([0u8]).chain_update(task.as_bytes()).finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("eight bytes"))
}

/// The agent among `agents` that serves `task`: the highest score (ties,
/// which SHA-256 makes vanishingly rare, go to the lowest name).
pub fn owner<'a>(task: &str, agents: &'a [String]) -> Option<&'a str> {
    agents.iter().max_by(|a, b| score(a, task).cmp(&score(b, task)).then_with(|| b.cmp(a))).map(String::as_str)
}

/// The agents that count as live for affinity, by name: not stopped, with
/// a heartbeat younger than half their lease (by the store's clock; they
/// beat every third of it). Sorted.
pub fn live_agents(c: &dyn Db) -> Result<Vec<String>> {
    c.column(
        "SELECT name FROM agents WHERE stopped_at IS NULL AND heartbeat_at >= apollo_now_plus(-(lease_secs / 2)) \
         ORDER BY name",
        &[],
    )
}

/// The agents among `live` that serve a queue dedicated to `only` (all of
/// them when it is empty), with `me` (the claiming agent, alive by
/// definition) among them.
pub fn serving(live: &[String], only: &[String], me: &str) -> Vec<String> {
    let mut out: Vec<String> = live.iter().filter(|a| only.is_empty() || only.contains(a)).cloned().collect();
    if !out.iter().any(|a| a == me) {
        out.push(me.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_task_has_one_owner_and_only_a_leavers_tasks_move() {
        let three: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let two: Vec<String> = ["a", "c"].iter().map(|s| s.to_string()).collect();
        let tasks: Vec<String> = (0..300).map(|i| format!("task_{i}")).collect();
        let mut per = std::collections::BTreeMap::new();
        for t in &tasks {
            let o = owner(t, &three).unwrap();
            *per.entry(o).or_insert(0) += 1;
            let after = owner(t, &two).unwrap();
            // A task of a or c stays where it was when b leaves.
            if o != "b" {
                assert_eq!(after, o, "{t}");
            }
        }
        // About a third each.
        assert!(per.values().all(|n| (70..130).contains(n)), "{per:?}");
        assert_eq!(score("a", "t"), score("a", "t"));
        assert_ne!(score("a", "t"), score("b", "t"));
    }
}
