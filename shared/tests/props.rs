//! Property tests of the definition loader: whatever text it is given, it
//! returns a definition or errors that each name a line or a field, and
//! never panics. (`fuzz/` runs the same entry point under libFuzzer.)

use apollo_shared::def;
use proptest::prelude::*;

/// Text shaped like a definition: known keys, odd values, YAML punctuation.
fn definition_like() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        prop::sample::select(vec![
            "task",
            "steps",
            "params",
            "plugin",
            "name",
            "timeout",
            "retry",
            "on_failure",
            "schedule",
            "max_active",
            "priority",
            "queue",
            "env",
        ])
        .prop_map(str::to_string),
        "[a-z_]{1,8}",
    ];
    let value = prop_oneof![
        Just(String::new()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("&a x".to_string()),
        Just("*a".to_string()),
        Just("\"{{ params.x }}\"".to_string()),
        Just("-1".to_string()),
        Just("1e999".to_string()),
        Just("- plugin: shell".to_string()),
        "[ -~]{0,20}",
    ];
    let line = (0usize..4, key, value).prop_map(|(indent, k, v)| format!("{}{k}: {v}", "  ".repeat(indent)));
    (prop::collection::vec(line, 0..30), any::<bool>())
        .prop_map(|(lines, bom)| format!("{}{}\n", if bom { "\u{feff}" } else { "" }, lines.join("\n")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_text_loads_or_is_refused_with_located_errors(src in "\\PC{0,400}") {
        if let Err(errs) = def::parse(&src, "tasks/x.yaml") {
            prop_assert!(!errs.0.is_empty());
            for e in &errs.0 {
                prop_assert!(e.to_string().starts_with("tasks/x.yaml"), "{}", e);
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn definition_shaped_text_loads_or_names_what_is_wrong(src in definition_like()) {
        match def::parse(&src, "tasks/x.yaml") {
            Ok(d) => prop_assert!(!d.steps.is_empty() && !d.task.is_empty()),
            Err(errs) => {
                for e in &errs.0 {
                    prop_assert!(e.line.is_some() || !e.field.is_empty(), "no line nor field: {}", e);
                }
            }
        }
    }
}
