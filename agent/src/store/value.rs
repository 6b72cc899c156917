//! The values the store's SQL binds and reads, on either backend. Every statement of the
//! store is written once, in the SQL both SQLite and PostgreSQL accept, with
//! `?N` placeholders; `Db` runs it on a SQLite connection as it is, and on
//! a PostgreSQL connection with the placeholders renumbered `$N` and SQLite's
//! planner hints (`INDEXED BY`) left out. Values cross as [`V`], read back by
//! column with [`Row::get`].
//!
//! Times are fixed-width RFC 3339 UTC text on both (they sort as text), and
//! `apollo_now()` / `apollo_now_plus(secs)` give the database's clock in that
//! form: leases are measured by it, so agents on several hosts never compare
//! their own clocks.

use super::{Result, StoreError};

/// A value bound to a placeholder or read from a column.
#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    /// Bytes (SQLite's compressed archive documents).
    Blob(Vec<u8>),
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for V {
            fn from(v: $t) -> V {
                V::Int(v as i64)
            }
        }
    )*};
}
from_int!(i64, i32, u32, u8, usize);

impl From<bool> for V {
    fn from(v: bool) -> V {
        V::Int(v as i64)
    }
}
impl From<f64> for V {
    fn from(v: f64) -> V {
        V::Real(v)
    }
}
impl From<&str> for V {
    fn from(v: &str) -> V {
        V::Text(v.to_string())
    }
}
impl From<String> for V {
    fn from(v: String) -> V {
        V::Text(v)
    }
}
impl From<&String> for V {
    fn from(v: &String) -> V {
        V::Text(v.clone())
    }
}
impl<T: Into<V>> From<Option<T>> for V {
    fn from(v: Option<T>) -> V {
        v.map(Into::into).unwrap_or(V::Null)
    }
}

/// `p![a, b, c]`: the values of a statement's placeholders, in order.
macro_rules! p {
    ($($x:expr),* $(,)?) => { &[$($crate::store::value::V::from($x)),*] };
}
pub(crate) use p;

/// One row of a result.
#[derive(Debug, Clone)]
pub struct Row(pub Vec<V>);

/// A Rust type a column reads into.
pub trait FromV: Sized {
    fn from_v(v: &V) -> Option<Self>;
}

impl FromV for i64 {
    fn from_v(v: &V) -> Option<i64> {
        match v {
            V::Int(i) => Some(*i),
            V::Real(f) => Some(*f as i64),
            _ => None,
        }
    }
}
macro_rules! from_v_int {
    ($($t:ty),*) => {$(
        impl FromV for $t {
            fn from_v(v: &V) -> Option<$t> {
                i64::from_v(v).and_then(|i| <$t>::try_from(i).ok())
            }
        }
    )*};
}
from_v_int!(u32, u8, i32, u64);

impl FromV for bool {
    fn from_v(v: &V) -> Option<bool> {
        i64::from_v(v).map(|i| i != 0)
    }
}
impl FromV for f64 {
    fn from_v(v: &V) -> Option<f64> {
        match v {
            V::Real(f) => Some(*f),
            V::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}
impl FromV for String {
    fn from_v(v: &V) -> Option<String> {
        match v {
            V::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}
/// A time as a column holds it: RFC 3339 text, or (SQLite's history rows)
/// microseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct When(pub Option<chrono::DateTime<chrono::Utc>>);

impl FromV for When {
    fn from_v(v: &V) -> Option<When> {
        Some(When(match v {
            V::Int(us) => chrono::DateTime::from_timestamp_micros(*us),
            V::Text(s) => chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| t.with_timezone(&chrono::Utc)),
            _ => None,
        }))
    }
}

impl<T: FromV> FromV for Option<T> {
    fn from_v(v: &V) -> Option<Option<T>> {
        match v {
            V::Null => Some(None),
            v => T::from_v(v).map(Some),
        }
    }
}

impl Row {
    /// Column `i` as a `T`; an error naming the column when it is not one.
    pub fn get<T: FromV>(&self, i: usize) -> Result<T> {
        let v = self.0.get(i).unwrap_or(&V::Null);
        T::from_v(v)
            .ok_or_else(|| StoreError::Invalid(format!("column {i}: {v:?} is not a {}", std::any::type_name::<T>())))
    }
}

/// The PostgreSQL text of a statement: `?N` becomes `$N`, `INDEXED BY x`
/// goes (PostgreSQL's planner needs no hint).
pub fn to_postgres(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut words = sql.split_inclusive(char::is_whitespace).peekable();
    while let Some(w) = words.next() {
        if w.trim_end() == "INDEXED" && words.peek().is_some_and(|n| n.trim_end() == "BY") {
            words.next();
            words.next();
            continue;
        }
        out.push_str(w);
    }
    let mut s = String::with_capacity(out.len());
    let mut chars = out.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == '?' && !quoted && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            s.push('$');
        } else {
            s.push(c);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_renumbered_and_hints_dropped_for_postgres() {
        assert_eq!(
            to_postgres("SELECT id FROM t INDEXED BY t_state WHERE a = ?1 AND b = '?2' AND c = ?12"),
            "SELECT id FROM t WHERE a = $1 AND b = '?2' AND c = $12"
        );
    }

    #[test]
    fn values_read_back_as_the_types_asked_for() {
        let row = Row(vec![V::Int(3), V::Null, V::Text("x".into()), V::Real(1.5)]);
        assert_eq!(row.get::<u32>(0).unwrap(), 3);
        assert_eq!(row.get::<Option<String>>(1).unwrap(), None);
        assert_eq!(row.get::<String>(2).unwrap(), "x");
        assert_eq!(row.get::<f64>(3).unwrap(), 1.5);
        assert!(row.get::<String>(0).is_err());
    }
}
