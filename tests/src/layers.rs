//! The layers of ARCHITECTURE.md, enforced: every path a source file of
//! the agent or the console names into its own crate (`crate::…`,
//! `super::…`, a child module by name) is an edge between two files; the
//! rules say which edges may not exist, and no files may import each other
//! in a circle. A failure names the file, the line, the path and the rule.

use crate::repo;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module (`store::write`, `crate` for lib.rs) and the file it is.
pub struct Module {
    pub file: String,
    /// The module's text, its tests left out (a test may reach anything).
    pub text: String,
}

pub fn modules(src: &Path) -> BTreeMap<String, Module> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut out = BTreeMap::new();
    for p in files {
        let rel = p.strip_prefix(src).unwrap().with_extension("");
        let rel = rel.to_str().unwrap();
        // Binaries are crates of their own, which reach the library by name.
        if rel.starts_with("bin/") || (rel == "main" && src.join("lib.rs").exists()) {
            continue;
        }
        let name = match rel {
            "lib" | "main" => "crate".to_string(),
            r => r.trim_end_matches("/mod").replace('/', "::"),
        };
        let text = std::fs::read_to_string(&p).unwrap();
        let text = strip_tests(&strip_comments(&text));
        out.insert(name, Module { file: p.strip_prefix(repo()).unwrap().display().to_string(), text });
    }
    out
}

/// Comments and string literals blanked (newlines kept, for line numbers).
pub fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            while i < b.len() && !b[i..].starts_with(b"*/") {
                out.push(if b[i] == b'\n' { '\n' } else { ' ' });
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' || (b[i] == b'r' && b.get(i + 1).is_some_and(|c| *c == b'"' || *c == b'#')) {
            // A string: plain, or raw with as many #s as it opens with.
            let raw = b[i] == b'r';
            let mut hashes = 0;
            if raw {
                i += 1;
                while b.get(i) == Some(&b'#') {
                    hashes += 1;
                    i += 1;
                }
                if b.get(i) != Some(&b'"') {
                    out.push('r');
                    continue;
                }
            }
            i += 1;
            while i < b.len() {
                if !raw && b[i] == b'\\' {
                    i += 2;
                    continue;
                }
                if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|c| **c == b'#').count() == hashes {
                    i += 1 + hashes;
                    break;
                }
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The text before a `#[cfg(test)]` module (tests sit at a file's end).
pub fn strip_tests(text: &str) -> String {
    let mut at = 0;
    while let Some(found) = text[at..].find("#[cfg(test)]") {
        let start = at + found;
        let after = text[start + 12..].trim_start();
        if after.starts_with("mod ") {
            return text[..start].to_string();
        }
        at = start + 12;
    }
    text.to_string()
}

/// Every path at `i` in `text` (after `crate::`, say): `a::b`, or a tree
/// `a::{b, c::{d, e}}`, flattened.
pub fn paths_at(text: &str, i: usize) -> Vec<String> {
    fn tree(b: &[u8], i: &mut usize, prefix: &str, out: &mut Vec<String>) {
        let mut path = prefix.to_string();
        loop {
            while *i < b.len() && b[*i].is_ascii_whitespace() {
                *i += 1;
            }
            if *i < b.len() && b[*i] == b'{' {
                *i += 1;
                loop {
                    tree(b, i, &path, out);
                    while *i < b.len() && b[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *i < b.len() && b[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    if b.get(*i) == Some(&b'}') {
                        *i += 1;
                        return;
                    }
                }
            }
            let start = *i;
            while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b[*i] == b'_' || b[*i] == b'*') {
                *i += 1;
            }
            let seg = std::str::from_utf8(&b[start..*i]).unwrap();
            if seg.is_empty() {
                out.push(path);
                return;
            }
            path = if path.is_empty() { seg.to_string() } else { format!("{path}::{seg}") };
            if b[*i..].starts_with(b"::") {
                *i += 2;
                continue;
            }
            out.push(path);
            return;
        }
    }
    let mut out = Vec::new();
    let mut i = i;
    tree(text.as_bytes(), &mut i, "", &mut out);
    out
}

/// The module a path names: its longest prefix that is a module.
pub fn resolve<'a>(mods: &'a BTreeMap<String, Module>, path: &str) -> Option<&'a str> {
    let parts: Vec<&str> = path.split("::").filter(|p| *p != "self" && *p != "*").collect();
    (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find_map(|m| mods.get_key_value(&m).map(|(k, _)| k.as_str()))
}

/// Re-exports: `(module, name)` → the module `name` is defined in, for
/// every `pub use` of a module's own children (a facade). Naming a
/// re-exported item is an edge to the file that defines it.
pub fn reexports(mods: &BTreeMap<String, Module>) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (name, m) in mods {
        let own = if name == "crate" { String::new() } else { format!("{name}::") };
        for (i, line) in m.text.lines().enumerate() {
            let Some(rest) = line
                .trim_start()
                .strip_prefix("pub use ")
                .or_else(|| line.trim_start().strip_prefix("pub(crate) use "))
            else {
                continue;
            };
            // The statement may run over several lines.
            let at: usize = m.text.lines().take(i).map(|l| l.len() + 1).sum::<usize>() + (line.len() - rest.len());
            for p in paths_at(&m.text, at) {
                let full = format!("{own}{}", p.trim_start_matches("self::"));
                let Some(target) = resolve(mods, &full) else { continue };
                let Some(item) = p.rsplit("::").next() else { continue };
                if target != name && item != "*" && item != "self" {
                    out.insert((name.clone(), item.to_string()), target.to_string());
                }
            }
        }
    }
    out
}

/// Whether `line` of `text` is a `pub use` (a facade line, not an import).
pub fn is_reexport(text: &str, line: usize) -> bool {
    text.lines().nth(line - 1).is_some_and(|l| {
        let l = l.trim_start();
        l.starts_with("pub use ") || l.starts_with("pub(crate) use ")
    })
}

/// An edge: `from` names something of `to` at `line` as `path`.
#[derive(Clone, Debug)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub line: usize,
    pub path: String,
}

pub fn edges(mods: &BTreeMap<String, Module>) -> Vec<Edge> {
    let again = reexports(mods);
    let mut out = Vec::new();
    for (name, m) in mods {
        let parent = match name.rsplit_once("::") {
            Some((p, _)) => p.to_string(),
            None if name == "crate" => String::new(),
            None => String::new(),
        };
        let own = if name == "crate" { String::new() } else { format!("{name}::") };
        let b = m.text.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
            if !boundary || !(b[i].is_ascii_alphabetic() || b[i] == b'_') {
                i += 1;
                continue;
            }
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            if !b[i..].starts_with(b"::") {
                continue;
            }
            let word = &m.text[start..i];
            // `super::super::…` climbs once per `super`.
            let mut up = parent.clone();
            if word == "super" {
                while m.text[i + 2..].starts_with("super::") {
                    i += 7;
                    up = up.rsplit_once("::").map(|(p, _)| p.to_string()).unwrap_or_default();
                }
            }
            let base = match word {
                "crate" => String::new(),
                "super" => up,
                "self" => own.trim_end_matches("::").to_string(),
                child if mods.contains_key(&format!("{own}{child}")) => format!("{own}{child}"),
                _ => continue,
            };
            let line = m.text[..start].matches('\n').count() + 1;
            let paths = paths_at(&m.text, i + 2);
            // `crate::name!`: an exported macro lives at the root wherever
            // it is written.
            let end = m.text[i + 2..].find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).map(|n| i + 2 + n);
            if end.is_some_and(|n| b.get(n) == Some(&b'!')) {
                continue;
            }
            for p in paths {
                let full = match (base.is_empty(), p.is_empty()) {
                    (true, _) => p.clone(),
                    (false, true) => base.clone(),
                    (false, false) => format!("{base}::{p}"),
                };
                let mut to = resolve(mods, &full).map(str::to_string).unwrap_or_else(|| {
                    if base.is_empty() {
                        "crate".to_string()
                    } else {
                        base.clone()
                    }
                });
                // Through a facade's `pub use` to the file that defines it.
                let prefix = if to == "crate" { String::new() } else { format!("{to}::") };
                if let Some(item) = full.strip_prefix(&prefix).and_then(|r| r.split("::").next()) {
                    let mut seen = 0;
                    while let Some(t) = again.get(&(to.clone(), item.to_string())) {
                        to = t.clone();
                        seen += 1;
                        if seen > 8 {
                            break;
                        }
                    }
                }
                // A facade naming its own children is not an import.
                if within(&to, name) && name != &to && is_reexport(&m.text, line) {
                    continue;
                }
                if name == "crate" && is_reexport(&m.text, line) {
                    continue;
                }
                if to != *name {
                    out.push(Edge { from: name.clone(), to, line, path: format!("{word}::{p}") });
                }
            }
        }
    }
    out
}

/// Is `module` inside `prefix` (the module itself or one of its children)?
pub fn within(module: &str, prefix: &str) -> bool {
    module == prefix || module.starts_with(&format!("{prefix}::"))
}

/// Import circles between files, each as the edges that close it.
pub fn circles(mods: &BTreeMap<String, Module>, edges: &[Edge]) -> Vec<Vec<Edge>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in edges {
        next.entry(&e.from).or_default().insert(&e.to);
    }
    // Tarjan's strongly connected components.
    struct T<'a> {
        next: &'a BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for &w in t.next.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w);
                if w == v {
                    break;
                }
            }
            t.out.push(comp);
        }
    }
    let mut t = T {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for m in mods.keys() {
        if !t.index.contains_key(m.as_str()) {
            visit(&mut t, m);
        }
    }
    t.out
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let set: BTreeSet<&str> = c.into_iter().collect();
            edges.iter().filter(|e| set.contains(e.from.as_str()) && set.contains(e.to.as_str())).cloned().collect()
        })
        .collect()
}

/// What a crate's layers forbid: a module (and its children) that may not
/// name another (or its children), and why.
pub type Rule = (&'static str, &'static [&'static str], &'static str);

pub fn check(krate: &str, rules: &[Rule]) -> Vec<String> {
    let mods = modules(&repo().join(krate).join("src"));
    let all = edges(&mods);
    let mut problems = Vec::new();
    for e in &all {
        for (from, forbidden, why) in rules {
            if within(&e.from, from) && !within(&e.to, from) && forbidden.iter().any(|f| within(&e.to, f)) {
                problems.push(format!("{}:{}: `{}` reaches {}: {why}", mods[&e.from].file, e.line, e.path, e.to));
            }
        }
    }
    for circle in circles(&mods, &all) {
        // One line per pair of files, at the first place it is named.
        let mut seen = BTreeSet::new();
        let said: Vec<String> = circle
            .iter()
            .filter(|e| seen.insert((e.from.clone(), e.to.clone())))
            .map(|e| format!("  {} → {}  ({}:{}: `{}`)", e.from, e.to, mods[&e.from].file, e.line, e.path))
            .collect();
        problems.push(format!("an import circle between files of {krate}:\n{}", said.join("\n")));
    }
    problems
}
