//! The instruction guard: the release agent under `valgrind --tool=callgrind`
//! runs N and then 4N instances through its socket, and what one more
//! instance costs (the difference of the two totals over the difference of
//! the counts: start-up and shut-down cancel out) must stay under a ceiling
//! written here with the measurement that set it. Instruction counts do not
//! move with the machine's load, so this can fail honestly where a timing
//! could not: a rail paid for on every instance shows here the day it lands.
//!
//! Four shapes: three no-op steps; the same with a lock taken and a pause in
//! force on another queue (the claim's rails); an approval step decided over
//! the socket, then a no-op step; and a fan-out step's items (per item, from
//! one instance of 40 and one of 200). One agent runs them all, measured a
//! phase at a time (`callgrind_control --zero`, then `--dump`), after ten
//! instances that warm it up; about 16 s under callgrind, once the release
//! build exists (the test makes it: some minutes the first time).

use apollo_shared::protocol::{ApprovalDecide, PauseScope, PauseStart};
use apollo_tests::*;
use serde_json::json;
use std::path::PathBuf;
use std::sync::OnceLock;

const NOOP: &str =
    "task: noop\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  - {name: c, plugin: sleep}\n";
const LOCKED: &str =
    "task: locked\nlocks: [\"db:eu\"]\nsteps:\n  - {name: a, plugin: sleep}\n  - {name: b, plugin: sleep}\n  \
                      - {name: c, plugin: sleep}\n";
const OTHER: &str = "task: other\nqueue: other\nsteps:\n  - plugin: sleep\n";
const FANOUT: &str = "task: fanout\nparams:\n  n: {default: 1}\nsteps:\n  - name: each\n    plugin: sleep\n    \
                      foreach: \"{{ range(params.n) | list }}\"\n    max_parallel: 4\n";
const GATED: &str =
    "task: gated\nsteps:\n  - {name: gate, plugin: approval, params: {message: go?}}\n  - {name: b, plugin: sleep}\n";

/// Instructions per instance, and the ceilings. First set at the commit
/// that added this test (2026-12-04: noop 1,089,204 · 1,113,159 ·
/// 1,088,289, ceiling 1,169,000). Lowered 2026-12-05 with the executor's
/// future boxed at its spawn and a step's SUCCESS written as one key-range
/// statement with its context serialized once (valgrind 3.19, one agent,
/// phases of 10 and 40 instances after 10 unmeasured), three runs: noop
/// 926,880 · 908,518 · 906,658; a lock and a pause 1,363,257 · 1,345,450 ·
/// 1,332,515; an approval 1,853,060 · 1,778,967 · 1,860,113. Each ceiling
/// is the highest of its three plus 5 %. Lowered below its figure (900,000
/// for noop was tried) the test fails. Lowered again 2026-12-06 with the
/// context made from the row and the steps' outputs (a961cb3) and the
/// archive compressed (23549a0), three runs at 07c2e37: noop 869,021 ·
/// 863,770 · 877,942; a lock and a pause 1,353,485 · 1,326,445 ·
/// 1,331,234; an approval 1,689,278 · 1,815,077 · 1,818,919. Lowered
/// with rusqlite 0.43 (SQLite 3.54) and the planner's stability guarantee
/// (without it the upgrade read noop 1,519,665 · 1,521,340 · 1,521,279 and
/// failed here), three runs: noop 849,405 · 826,900 · 843,484; a lock and
/// a pause 1,299,011 · 1,300,020 · 1,295,859; an approval 1,689,555 ·
/// 1,622,723 · 1,640,898 (its ceiling kept above the 1.82 M an approval
/// has read before: the polls it makes while it waits vary). Lowered
/// 2026-12-07 (a claim's first start not read again, the call's context
/// made when read, an unread index dropped, the claim's tasks found by
/// seeks), three runs at 5ace5f6: noop 769,305 · 774,303 · 773,082; a lock
/// and a pause 1,213,978 · 1,213,798 · 1,225,051 (an approval 1,611,834 ·
/// 1,641,934 · 1,662,902: its ceiling kept). 2026-12-07 again: the
/// instance a trigger's write made is handed on without a read back, and
/// the agent has 64 slots, so every noop instance is claimed by its
/// trigger's write (with the default four, how many waited for the
/// scheduler's claim varied with timing: 714,000–727,000 or
/// 755,000–808,000 per instance in eleven runs), and the lock-and-pause
/// instances all wait on the lock at once (a heavier shape than before:
/// 1.19–1.24 M with four slots). Four runs: noop 718,554 · 716,298 ·
/// 720,526 · 714,057; a lock and a pause 1,479,956 · 1,506,478 · 1,524,064
/// · 1,534,327 (an approval 1,612,895 · 1,520,211 · 1,530,772 · 1,521,715:
/// its ceiling kept). Lowered again 2026-12-07 with SQLite's schema 27
/// (the live states counted when read, only the ended ones by trigger; no
/// statement journal for an instance's single-row moves), three runs:
/// noop 690,127 · 697,858 · 695,344; a lock and a pause 1,466,722 ·
/// 1,447,047 · 1,458,689 (an approval 1,517,394 · 1,558,161 · 1,570,320:
/// its ceiling kept). Lowered again the same day with SQLite's schema 28
/// (no function in the claim's move or the operators' index; a silent
/// step's log takes no notifier), three runs: noop 662,819 · 667,135 ·
/// 666,244 (a lock and a pause 1,471,638 · 1,452,165 · 1,428,326, an
/// approval 1,428,804 · 1,530,431 · 1,435,318: their ceilings kept).
/// Issue 36's goal is 600,000 for noop; docs/benchmarks.md ("Issue 36:
/// where the figures stand") says what stands between it and the figure.
/// These hold the line and are lowered with each gain.
const CEILING_NOOP: f64 = 701_000.0;
const CEILING_RAILS: f64 = 1_541_000.0;
const CEILING_APPROVAL: f64 = 1_860_000.0;
/// One more item of a fan-out step (sleep 0, `max_parallel: 4`: its start
/// and its end, each a write with the step's guard), between one instance
/// of 40 items and one of 200. Added with fan-out (2026-12-04: 182,279 ·
/// 185,221 · 188,713, ceiling 198,000); lowered 2026-12-05 to 187,000 from
/// three runs of 176,274 · 177,477 · 176,589, which was too tight: four
/// items run at once, and how their writes share commits varies from run
/// to run. 2026-12-06, three runs at 07c2e37: 180,015 · 189,008 · 182,798
/// (one failed the 187,000); the highest plus 5 %.
const CEILING_ITEM: f64 = 199_000.0;

#[derive(Clone, Copy, Debug)]
enum Shape {
    Noop,
    Rails,
    Approval,
}

/// The plain release agent (no fail points), as the package and the
/// benchmarks run it, built once for this test binary.
fn release_agent() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target = bin_dir().parent().expect("target dir").to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .current_dir(repo())
                .args(["build", "--quiet", "--release", "-p", "apollo-agent", "--bin", "apollo-agent"])
                .status()
                .expect("run cargo build --release");
            assert!(status.success(), "cargo build --release -p apollo-agent failed");
            target.join("release/apollo-agent")
        })
        .clone()
}

fn valgrind() {
    let found = std::process::Command::new("valgrind").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "valgrind is missing: install Debian's valgrind (`bash .ci/run` does)"
    );
}

async fn wait_for_successes(c: &apollo_tui::client::Client, n: usize) {
    // Polled twice a second, so the count is of the instances' work, not
    // of answering a watcher.
    loop {
        let s = status(c).await.expect("status");
        let of = |state: &str| s.counts.get(state).and_then(|v| v.as_u64()).unwrap_or(0);
        let done = of("SUCCESS");
        assert_eq!(of("FAILED"), 0, "{:?}", s.counts);
        if done as usize >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// One agent under callgrind, measured a phase at a time: its counters
/// zeroed at a phase's start and dumped at its end (`callgrind_control`),
/// each dump a file of its own with the phase's total.
struct Meter {
    agent: Agent,
    file: PathBuf,
    dumps: usize,
    _dir: tempfile::TempDir,
}

impl Meter {
    fn start() -> Meter {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("callgrind.out");
        let wrap = format!("valgrind --tool=callgrind --callgrind-out-file={} --dump-instr=no", file.display());
        let agent = Agent::builder()
            // Slots for every instance a phase triggers, so each is claimed
            // by its trigger's write (with fewer, how many waited for the
            // scheduler's claim instead varied with timing: 720,000 or
            // 790,000 per instance, run to run). A lease of ten minutes:
            // the maintenance tick (a third of it) never falls inside a
            // phase, whose count it would swell by its heartbeat, archive
            // and sweep.
            .config("logging:\n  level: warn\nscheduler:\n  concurrency: 64\n  lease: 10m\n")
            .task("noop.yaml", NOOP)
            .task("locked.yaml", LOCKED)
            .task("other.yaml", OTHER)
            .task("gated.yaml", GATED)
            .task("fanout.yaml", FANOUT)
            .under(&wrap, release_agent())
            .start();
        Meter { agent, file, dumps: 0, _dir: dir }
    }

    fn control(&self, arg: &str) {
        let out = std::process::Command::new("callgrind_control")
            .arg(arg)
            .arg(self.agent.pid().to_string())
            .output()
            .expect("run callgrind_control (valgrind's)");
        assert!(out.status.success(), "callgrind_control {arg}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The instructions `work` made the agent run.
    async fn phase(&mut self, work: impl std::future::Future<Output = ()>) -> u64 {
        self.control("--zero");
        work.await;
        self.dumps += 1;
        self.control(&format!("--dump=phase{}", self.dumps));
        let file = PathBuf::from(format!("{}.{}", self.file.display(), self.dumps));
        // The dump is written by the agent's process as it answers.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let total = text.lines().find_map(|l| l.strip_prefix("totals: ")).and_then(|v| v.trim().parse().ok());
            if let Some(total) = total {
                // INSTR_BENCH_OUT=DIR keeps each phase's file, for callgrind_annotate.
                if let Some(dir) = std::env::var_os("INSTR_BENCH_OUT") {
                    let _ = std::fs::create_dir_all(&dir);
                    let _ = std::fs::copy(&file, PathBuf::from(dir).join(format!("phase{}.out", self.dumps)));
                }
                return total;
            }
            assert!(std::time::Instant::now() < deadline, "no dump {} in 60s:\n{}", file.display(), self.agent.log());
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// `n` instances of `shape`, run to their end.
async fn work(c: &apollo_tui::client::Client, shape: Shape, n: usize, done_before: usize) {
    match shape {
        Shape::Noop | Shape::Rails => {
            let task = if matches!(shape, Shape::Noop) { "noop" } else { "locked" };
            for _ in 0..n {
                trigger(c, task, json!({})).await;
            }
        }
        Shape::Approval => {
            let mut ids = Vec::new();
            for _ in 0..n {
                ids.push(trigger(c, "gated", json!({})).await);
            }
            loop {
                let asked = c.request::<m::ApprovalsList>(NoParams {}).await.expect("approvals");
                if asked.iter().filter(|a| a.decision.is_none()).count() == n {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            for id in ids {
                let decide = ApprovalDecide { id, deny: false, reason: "go".into() };
                c.request::<m::ApprovalsDecide>(decide).await.expect("approve");
            }
        }
    }
    wait_for_successes(c, done_before + n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_instance_costs_more_instructions_than_its_ceiling_plain_with_the_claims_rails_or_an_approval() {
    valgrind();
    let mut meter = Meter::start();
    let c = meter.agent.client().await;
    let (small, big) = (10, 40);
    // The first instances pay for what is made once (lazy statics, the
    // statement cache, the runtime's threads): run, not measured.
    work(&c, Shape::Noop, small, 0).await;
    let mut done = small;
    let mut figures = Vec::new();
    for (shape, ceiling) in
        [(Shape::Noop, CEILING_NOOP), (Shape::Rails, CEILING_RAILS), (Shape::Approval, CEILING_APPROVAL)]
    {
        if matches!(shape, Shape::Rails) {
            let pause = PauseStart {
                scope: PauseScope::Queue,
                target: Some("other".into()),
                until: None,
                reason: "guard".into(),
            };
            c.request::<m::SchedulerPause>(pause).await.expect("pause");
        }
        let a = meter.phase(work(&c, shape, small, done)).await;
        done += small;
        let b = meter.phase(work(&c, shape, big, done)).await;
        done += big;
        let per = b.saturating_sub(a) as f64 / (big - small) as f64;
        println!("{shape:?}: {a} instructions for {small} instances, {b} for {big}: {per:.0} per instance");
        figures.push((shape, per, ceiling));
    }
    // A fan-out's items: one instance of 40, then one of 200; what one
    // more item costs.
    let (few, many) = (40, 200);
    let mut fan = Vec::new();
    for n in [few, many] {
        let c = &c;
        let one = async move {
            trigger(c, "fanout", json!({"n": n})).await;
            wait_for_successes(c, done + 1).await;
        };
        fan.push(meter.phase(one).await);
        done += 1;
    }
    let per_item = fan[1].saturating_sub(fan[0]) as f64 / (many - few) as f64;
    println!("Fanout: {} instructions for {few} items, {} for {many}: {per_item:.0} per item", fan[0], fan[1]);
    drop(c);
    let ended = meter.agent.stop();
    assert!(ended.success(), "agent under valgrind ended with {ended}:\n{}", meter.agent.log());
    for (shape, per, ceiling) in figures {
        assert!(per <= ceiling, "{shape:?}: {per:.0} instructions per instance, over its ceiling {ceiling:.0}");
    }
    assert!(
        per_item <= CEILING_ITEM,
        "fan-out: {per_item:.0} instructions per item, over its ceiling {CEILING_ITEM:.0}"
    );
}
