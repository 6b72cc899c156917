//! Prometheus metrics (the `prometheus-client` crate): what ran, how long
//! steps took, what failed, how the store and the socket fare. Served as text
//! at `/metrics` when `metrics.listen` is set (off by default), and over the
//! socket (`agent.metrics`, `apollo metrics`) for hosts where no port may be
//! opened. Queue depth and running counts are read from the store at scrape
//! (`server::metrics`); this module names nothing else of the agent.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub created: Family<Labels, Counter>,
    pub finished: Family<Labels, Counter>,
    pub step_seconds: Histograms,
    pub retries: Family<Labels, Counter>,
    pub rollbacks: Family<Labels, Counter>,
    pub timeouts: Family<Labels, Counter>,
    pub reaped: Counter,
    pub alerts: Family<Labels, Counter>,
    pub queue_pending: Family<Labels, Gauge>,
    pub queue_running: Family<Labels, Gauge>,
    pub commit_seconds: Histogram,
    pub batch_size: Histogram,
    pub batch_retries: Counter,
    pub merged_writes: Counter,
    pub clients: Gauge,
}

fn step_histogram() -> Histogram {
    // 1 ms … about 9 minutes.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("apollo");
        let m = Metrics {
            created: Family::default(),
            finished: Family::default(),
            step_seconds: Family::new_with_constructor(step_histogram as fn() -> Histogram),
            retries: Family::default(),
            rollbacks: Family::default(),
            timeouts: Family::default(),
            reaped: Counter::default(),
            alerts: Family::default(),
            queue_pending: Family::default(),
            queue_running: Family::default(),
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            batch_retries: Counter::default(),
            merged_writes: Counter::default(),
            clients: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("instances_created", "Instances created, by task", m.created.clone());
        registry.register("instances_finished", "Instances that ended, by task and state", m.finished.clone());
        registry.register("step_duration_seconds", "Step executions, by plugin and outcome", m.step_seconds.clone());
        registry.register("retries", "Retries scheduled after a failed step, by task", m.retries.clone());
        registry.register("rollbacks", "Rollbacks started, by task", m.rollbacks.clone());
        registry.register("step_timeouts", "Steps stopped at their timeout, by plugin", m.timeouts.clone());
        registry.register("reaped", "Instances reaped as zombies", m.reaped.clone());
        registry.register("alerts", "Alerts raised, by kind", m.alerts.clone());
        registry.register(
            "queue_pending",
            "Instances waiting (PENDING or RETRYING), by queue",
            m.queue_pending.clone(),
        );
        registry.register("queue_running", "Instances running, by queue", m.queue_running.clone());
        registry.register("store_commit_seconds", "Time of one group commit", m.commit_seconds.clone());
        registry.register("store_batch_writes", "Writes in one group commit", m.batch_size.clone());
        registry.register(
            "store_batch_retries",
            "Group commits run again, a savepoint per write, after one of their writes failed",
            m.batch_retries.clone(),
        );
        registry.register(
            "store_merged_writes",
            "Steps' SUCCESS writes made together with others in one statement (PostgreSQL)",
            m.merged_writes.clone(),
        );
        registry.register("clients_connected", "Connections to the socket", m.clients.clone());
        Metrics { registry, ..m }
    }

    /// The exposition text, in OpenMetrics.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The content types of the two formats `/metrics` serves.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics text in Prometheus's classic text format (0.0.4), for the
/// scrapers and linters that do not ask for OpenMetrics (`promtool check
/// metrics`, curl): a counter's HELP and TYPE name its samples, `_total`
/// included, and there is no `# EOF`.
pub fn classic(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        open_metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(open_metrics.len() + 16 * counters.len());
    for line in open_metrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{tag}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The agent's metrics (one set per process).
pub fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
}

pub fn label(k: &'static str, v: &str) -> Labels {
    vec![(k, v.to_string())]
}

pub fn labels(a: (&'static str, &str), b: (&'static str, &str)) -> Labels {
    vec![(a.0, a.1.to_string()), (b.0, b.1.to_string())]
}

/// Sets the per-queue gauges: `(queue, pending, running)` for every queue
/// there is, idle ones at 0, and none other.
pub fn set_queues(queues: impl IntoIterator<Item = (String, u64, u64)>) {
    let m = get();
    m.queue_pending.clear();
    m.queue_running.clear();
    for (q, pending, running) in queues {
        m.queue_pending.get_or_create(&label("queue", &q)).set(pending as i64);
        m.queue_running.get_or_create(&label("queue", &q)).set(running as i64);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_classic_text_names_counters_as_their_samples() {
        let open = "# HELP apollo_reaped Instances reaped.\n# TYPE apollo_reaped counter\napollo_reaped_total 0\n\
                    # HELP apollo_clients_connected Connections.\n# TYPE apollo_clients_connected gauge\n\
                    apollo_clients_connected 1\n# EOF\n";
        assert_eq!(
            super::classic(open),
            "# HELP apollo_reaped_total Instances reaped.\n# TYPE apollo_reaped_total counter\napollo_reaped_total 0\n\
             # HELP apollo_clients_connected Connections.\n# TYPE apollo_clients_connected gauge\n\
             apollo_clients_connected 1\n"
        );
    }
}
