//! What a template refers to, read without rendering it: the variables it
//! reads (dotted, `steps.download.path`), and the filters, tests and
//! functions it calls. A definition's templates are checked with these when
//! it is loaded, so a name that cannot resolve is found by `check`, not
//! half-way through a run.

use minijinja::machinery::{tokenize, Token, WhitespaceConfig};
use std::collections::BTreeSet;

/// The names every template may read besides `params`, `steps` and `event`.
pub const FIXED_NAMES: &[&str] =
    &["params", "steps", "secrets", "event", "work_dir", "task_id", "trace_id", "task", "attempt"];

/// Filters, tests and functions minijinja has (what an unknown one is told).
const FILTERS: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "chain",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
    "urlencode",
    "zip",
];
const TESTS: &[&str] = &[
    "boolean",
    "defined",
    "divisibleby",
    "endingwith",
    "eq",
    "equalto",
    "escaped",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    "greaterthan",
    "gt",
    "in",
    "integer",
    "iterable",
    "le",
    "lessthan",
    "lower",
    "lt",
    "mapping",
    "ne",
    "none",
    "number",
    "odd",
    "safe",
    "sameas",
    "sequence",
    "startingwith",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
];
const FUNCTIONS: &[&str] = &["debug", "dict", "namespace", "range"];

/// What one template refers to.
#[derive(Debug, Default, PartialEq)]
pub struct Refs {
    /// Variables read, with the attributes read of them (`steps.x.path`).
    pub vars: BTreeSet<String>,
    pub filters: BTreeSet<String>,
    pub tests: BTreeSet<String>,
    pub functions: BTreeSet<String>,
}

/// The references of `text` (a string of a step's params or env), or the
/// template's syntax error.
/// The expression language's words that a parenthesis may follow.
const OPERATORS: &[&str] = &["and", "or", "not", "in", "is", "if", "else"];

pub fn refs(text: &str) -> Result<Refs, String> {
    let env = super::env();
    let template = env.template_from_str(text).map_err(|e| super::describe(&e))?;
    let mut out = Refs { vars: template.undeclared_variables(true).into_iter().collect(), ..Default::default() };
    let tokens: Vec<Token> = tokenize(text, false, Default::default(), WhitespaceConfig::default())
        .filter_map(|t| t.ok().map(|t| t.0))
        .collect();
    for (i, t) in tokens.iter().enumerate() {
        let Token::Ident(name) = t else { continue };
        let before = i.checked_sub(1).map(|j| &tokens[j]);
        let after = tokens.get(i + 1);
        match (before, after) {
            (Some(Token::Pipe), _) => {
                out.filters.insert(name.to_string());
            }
            // `{% filter upper %}`
            (Some(Token::Ident("filter")), _) if i >= 2 && matches!(tokens[i - 2], Token::BlockStart) => {
                out.filters.insert(name.to_string());
            }
            (Some(Token::Ident("is")), _) if *name != "not" => {
                out.tests.insert(name.to_string());
            }
            (Some(Token::Ident("not")), _) if i >= 2 && matches!(tokens[i - 2], Token::Ident("is")) => {
                out.tests.insert(name.to_string());
            }
            // A call of a name (not of an attribute: `x.items()` is a method;
            // nor an operator word before a parenthesis: `a or (b)`).
            (before, Some(Token::ParenOpen)) if !matches!(before, Some(Token::Dot)) && !OPERATORS.contains(name) => {
                out.functions.insert(name.to_string());
            }
            _ => {}
        }
    }
    // A function called is not a variable read.
    out.vars.retain(|v| !out.functions.contains(v.split('.').next().unwrap_or(v)));
    Ok(out)
}

/// Whether the environment has a filter, test or function of this name:
/// asked of the environment itself, by a use of it that fails only when the
/// name is unknown.
fn has(kind: &str, name: &str) -> bool {
    let env = super::env();
    let probe = match kind {
        "filter" => format!("{{{{ 1 | {name} }}}}"),
        "test" => format!("{{{{ 1 is {name} }}}}"),
        _ => format!("{{{{ {name} }}}}"),
    };
    let Ok(t) = env.template_from_str(&probe) else { return false };
    match t.render(minijinja::context! {}) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            minijinja::ErrorKind::UnknownFilter
                | minijinja::ErrorKind::UnknownTest
                | minijinja::ErrorKind::UndefinedError
        ),
    }
}

/// Each filter, test and function of `r` that does not exist: a message
/// naming it, the closest known one, and the known ones.
pub fn unknown_callables(r: &Refs) -> Vec<String> {
    let mut out = Vec::new();
    for (kind, names, known) in
        [("filter", &r.filters, FILTERS), ("test", &r.tests, TESTS), ("function", &r.functions, FUNCTIONS)]
    {
        for name in names.iter().filter(|n| !has(kind, n)) {
            let near = crate::text::closest(name, known).map(|k| format!("did you mean {k:?}? ")).unwrap_or_default();
            out.push(format!("unknown {kind} {name:?} ({near}known {kind}s: {})", known.join(", ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn variables_filters_tests_and_functions_are_found() {
        let r = refs("{{ steps.download.path | upper }} {% if params.n is odd %}{{ range(3) | join(',') }}{% endif %}")
            .unwrap();
        assert_eq!(r.vars, set(&["params.n", "steps.download.path"]));
        assert_eq!(r.filters, set(&["join", "upper"]));
        assert_eq!(r.tests, set(&["odd"]));
        assert_eq!(r.functions, set(&["range"]));
        let r = refs("{% for x in params.hosts %}{{ x.name }}{% endfor %}").unwrap();
        assert_eq!(r.vars, set(&["params.hosts"]), "a loop variable is the template's own");
        assert!(refs("{{ params.x ").is_err());
    }

    #[test]
    fn an_operator_before_a_parenthesis_is_not_a_call() {
        let r = refs("{{ a or (b | trim) != 'x' and not (c) }}").unwrap();
        assert!(r.functions.is_empty(), "{:?}", r.functions);
        assert!(unknown_callables(&r).is_empty());
    }

    #[test]
    fn unknown_callables_are_named_with_the_closest_known_one() {
        let r =
            refs("{{ params.x | uper }} {{ params.y is od }} {{ rnage(2) }} {{ params.z | default('a') }}").unwrap();
        let said = unknown_callables(&r);
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(
            said[0].starts_with("unknown filter \"uper\" (did you mean \"upper\"? known filters: abs,"),
            "{said:?}"
        );
        assert!(said[1].contains("unknown test \"od\" (did you mean \"odd\"?"), "{said:?}");
        assert!(said[2].contains("unknown function \"rnage\" (did you mean \"range\"?"), "{said:?}");
    }
}
