use super::*;
use serde_json::json;

const ORIGINAL: &str = r#"task: daily_report
priority: high
steps:
  - plugin: file_downloader
    params:
      source: s3://bucket/report.csv
  - plugin: data_parser
    params:
      format: csv
  - plugin: report_generator
    params:
      template: daily.html
"#;

#[test]
fn the_plain_form_of_the_original_design_parses() {
    let d = parse(ORIGINAL, "daily.yaml").unwrap();
    assert_eq!(d.task, "daily_report");
    assert_eq!(d.priority, PRIORITY_HIGH);
    assert_eq!(d.queue, "default");
    assert_eq!(d.on_failure, OnFailure::Rollback);
    let names: Vec<_> = d.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["file_downloader", "data_parser", "report_generator"]);
    assert_eq!(d.steps.iter().map(|s| s.line).collect::<Vec<_>>(), [Some(4), Some(7), Some(10)]);
}

#[test]
fn the_full_form_parses() {
    let src = r#"
task: daily_report
priority: 90
queue: reports
schedule: "0 6 * * *"
timezone: Europe/Berlin
on_event: sales.uploaded
max_active: 1
on_failure: stop
params:
  date: "2026-01-01"
  region: {default: eu, description: sales region}
steps:
  - name: download
    plugin: file_downloader
    version: "^1"
    timeout: 2m
    retry: 3
    params:
      source: file://tasks/data/report.csv
      target: "{{ work_dir }}/report.csv"
"#;
    let d = parse(src, "f.yaml").unwrap();
    assert_eq!(d.priority, 90);
    assert_eq!(d.on_failure, OnFailure::Stop);
    assert_eq!(d.params["date"].default, Some(json!("2026-01-01")));
    assert_eq!(d.params["region"].description.as_deref(), Some("sales region"));
    let s = &d.steps[0];
    assert_eq!((s.timeout, s.retry, s.version.as_deref()), (Some(super::Timeout::Secs(120.0)), Some(3), Some("^1")));
}

fn first_error(src: &str) -> String {
    parse(src, "t.yaml").unwrap_err().0[0].to_string()
}

#[test]
fn messages_name_file_line_field_and_what_is_valid() {
    let src = "task: x\nsteps:\n  - plugin: shell\n    timeout: soon\n";
    assert_eq!(
        first_error(src),
        "t.yaml: line 4: steps[0].timeout: expected auto, seconds (a positive number) or a duration like \"30s\", \"5m\", \"1h\", found \"soon\""
    );
    let src = "task: x\ncron: '* * * * *'\nsteps:\n  - plugin: shell\n";
    assert!(first_error(src).starts_with("t.yaml: line 2: cron: unknown field \"cron\" (expected one of: task,"));
    let src = "task: x\nschedule: '61 * * * *'\nsteps:\n  - plugin: shell\n";
    assert!(first_error(src).starts_with("t.yaml: line 2: schedule: "));
    let src = "task: x\npriority: urgent\nsteps:\n  - plugin: shell\n";
    assert!(first_error(src).contains("expected high, normal, low, or a number from 0 to 100"));
    let src = "task: x\nsteps:\n  - plugin: shell\n  - name: a\n    plugin: shell\n    retry: -1\n";
    assert!(first_error(src).starts_with("t.yaml: line 6: steps[1].retry: expected a whole number"));
}

#[test]
fn missing_and_wrong_shapes_are_reported() {
    assert!(first_error("steps:\n  - plugin: shell\n").contains("task: missing field"));
    assert!(first_error("task: x\n").contains("steps: missing field"));
    assert!(first_error("task: x\nsteps: []\n").contains("is empty"));
    assert!(first_error("task: x\nsteps: shell\n").contains("expected a list of steps"));
    assert!(first_error("- a\n- b\n").contains("expected a mapping"));
    assert!(first_error("task: x\nsteps:\n  - params: {}\n").contains("missing field `plugin`"));
    assert!(first_error("task: [1]\nsteps:\n  - plugin: shell\n").contains("task: expected a string"));
    assert!(first_error("task: x\nsteps:\n  - plugin: shell\n    params: {a: '{{ oops'}\n").contains("bad template"));
    assert!(
        first_error("task: x\nsteps:\n  - plugin: shell\n    version: banana\n").contains("not a semver requirement")
    );
    assert!(first_error("task: x\ntimezone: Mars/Olympus\nsteps:\n  - plugin: shell\n").contains("unknown time zone"));
    assert!(first_error("task: x\nsteps:\n  - {plugin: shell, name: a}\n  - {plugin: shell, name: a}\n")
        .contains("duplicate step name"));
    assert!(first_error("task: 'x\nsteps: [").contains("t.yaml"));
}

#[test]
fn unnamed_steps_of_one_plugin_are_numbered() {
    let d = parse("task: x\nsteps:\n  - plugin: shell\n  - plugin: shell\n", "t").unwrap();
    assert_eq!(d.steps[1].name, "shell_2");
}

#[test]
fn durations() {
    assert_eq!(parse_duration(&json!(1.5)).unwrap(), 1.5);
    assert_eq!(parse_duration(&json!("250ms")).unwrap(), 0.25);
    assert_eq!(parse_duration(&json!("1h")).unwrap(), 3600.0);
    assert!(parse_duration(&json!(0)).is_err());
    assert!(parse_duration(&json!("5 parsecs")).is_err());
}

#[test]
fn catchup_and_filter_need_their_trigger() {
    let d = parse("task: x\nschedule: '0 6 * * *'\ncatchup: all\nsteps:\n  - plugin: shell\n", "t").unwrap();
    assert_eq!(d.catchup, Catchup::All);
    assert!(first_error("task: x\ncatchup: all\nsteps:\n  - plugin: shell\n")
        .contains("line 2: catchup: only applies with a schedule"));
    assert!(first_error("task: x\nschedule: '0 6 * * *'\ncatchup: often\nsteps:\n  - plugin: shell\n")
        .contains("expected skip, latest or all"));
    let d = parse("task: x\non_event: sales.uploaded\nfilter: {region: eu}\nsteps:\n  - plugin: shell\n", "t").unwrap();
    assert_eq!(d.filter["region"], json!("eu"));
    assert!(first_error("task: x\nfilter: {region: eu}\nsteps:\n  - plugin: shell\n")
        .contains("only applies with on_event"));
    assert!(first_error("task: x\non_event: e\nfilter: {region: [eu]}\nsteps:\n  - plugin: shell\n")
        .contains("filter.region: expected a plain value"));
}

mod templates {
    use crate::def::parse;

    fn errors(steps: &str, top: &str) -> Vec<String> {
        let src = format!(
            "task: t\n{top}steps:\n  - name: first\n    plugin: shell\n    params:\n      command: echo\n{steps}"
        );
        match parse(&src, "t.yaml") {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    fn step(command: &str) -> String {
        format!("  - name: second\n    plugin: shell\n    params:\n      command: \"{command}\"\n  - name: third\n    plugin: shell\n    params:\n      command: echo\n")
    }

    #[test]
    fn every_name_a_template_uses_is_resolved_at_load() {
        assert_eq!(
            errors(&step("{{ steps.first.result.rows }} {{ work_dir }} {{ attempt }}"), ""),
            Vec::<String>::new()
        );
        let e = errors(&step("cat {{ steps.nope.output }}"), "");
        assert_eq!(
            e,
            ["t.yaml: line 10: steps[1].params.command: steps.nope: no step \"nope\" runs before this one (earlier steps: first)"]
        );
        let e = errors(&step("{{ steps.frist.path }}"), "");
        assert!(e[0].ends_with("(earlier steps: first; did you mean \"first\"?)"), "{e:?}");
        let e = errors(&step("{{ steps.third.path }}"), "");
        assert!(e[0].contains("steps.third: step \"third\" runs after this one"), "{e:?}");
        let e = errors(&step("{{ steps.second.path }}"), "");
        assert!(e[0].contains("a step cannot read its own output"), "{e:?}");
        let e = errors(&step("{{ parms.x }}"), "");
        assert!(
            e[0].contains("parms: not a name a template can use") && e[0].contains("did you mean \"params\"?"),
            "{e:?}"
        );
        let e = errors(&step("{{ event.host }}"), "");
        assert!(
            e[0].contains("event is set only for an instance an event started: this definition has no on_event:"),
            "{e:?}"
        );
        assert!(errors(&step("{{ event.host }}"), "on_event: disk.full\n").is_empty());
    }

    #[test]
    fn params_must_be_declared_when_the_definition_declares_them_and_callables_must_exist() {
        let declared = "params:\n  host: db1\n";
        assert!(errors(&step("{{ params.host }}"), declared).is_empty());
        let e = errors(&step("{{ params.hots }}"), declared);
        assert!(
            e[0].contains(
                "params.hots: the definition declares no param \"hots\" (declared: host; did you mean \"host\"?)"
            ),
            "{e:?}"
        );
        // Without declared params, any may be passed.
        assert!(errors(&step("{{ params.anything }}"), "").is_empty());
        let e = errors(&step("{{ params.host | uper }}"), declared);
        assert!(e[0].contains("unknown filter \"uper\" (did you mean \"upper\"?"), "{e:?}");
        // A loop's own variable is not a name to resolve.
        assert!(errors(&step("{% for h in params.host %}{{ h }}{% endfor %}"), declared).is_empty());
    }
}

#[test]
fn on_failure_is_read_on_the_task_and_on_each_step() {
    let src = "task: x\non_failure: continue\nsteps:\n  - plugin: shell\n    on_failure: rollback\n  - plugin: shell\n";
    let d = parse(src, "f.yaml").unwrap();
    assert_eq!(d.on_failure, OnFailure::Continue);
    assert_eq!((d.steps[0].on_failure, d.steps[1].on_failure), (Some(OnFailure::Rollback), None));
    let src = "task: x\nsteps:\n  - plugin: shell\n    on_failure: ignore\n";
    assert_eq!(
        first_error(src),
        "t.yaml: line 4: steps[0].on_failure: expected rollback, stop or continue, found \"ignore\""
    );
}
