//! Archived documents as the store keeps them: the instance as `tasks.get`
//! shows it, its context in its stored form (`rows::compacted`), as JSON —
//! on SQLite compressed by zstd against a dictionary of typical documents
//! built into the agent (`archive.dict`: the bundled tasks' documents), so a
//! document of about 1.5 KB takes about 300 bytes. The first byte says how
//! a document is kept, so a later dictionary never misreads one an earlier
//! build wrote; documents kept as JSON text (PostgreSQL's, and SQLite's
//! before schema 23) are read as they are.

use super::value::V;
use apollo_shared::protocol::Instance;
use std::cell::RefCell;
use std::sync::LazyLock;
use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

/// The documents the first dictionary holds, one JSON a line (zstd takes
/// them as raw content: later lines are the closer matches).
const DICTIONARY_1: &[u8] = include_bytes!("archive.dict");
/// A document compressed against [`DICTIONARY_1`].
const ZSTD_DICTIONARY_1: u8 = 1;
/// The largest document read back (its context is bounded by
/// `scheduler.context_bytes`, its steps' outputs each by theirs).
const MAX_JSON: usize = 256 << 20;
/// zstd's level: documents are written once and read seldom, but written
/// by the maintenance while starts wait for the writer.
const LEVEL: i32 = 3;

/// The dictionary digested once (it is 22 KB: digesting it per document
/// would cost more than compressing), a compression context per thread.
static ENCODER: LazyLock<EncoderDictionary<'static>> = LazyLock::new(|| EncoderDictionary::copy(DICTIONARY_1, LEVEL));
static DECODER: LazyLock<DecoderDictionary<'static>> = LazyLock::new(|| DecoderDictionary::copy(DICTIONARY_1));

thread_local! {
    static COMPRESSOR: RefCell<std::io::Result<Compressor<'static>>> =
        RefCell::new(Compressor::with_prepared_dictionary(&ENCODER));
    static DECOMPRESSOR: RefCell<std::io::Result<Decompressor<'static>>> =
        RefCell::new(Decompressor::with_prepared_dictionary(&DECODER));
}

/// `doc` as it is kept: compressed bytes, or JSON text where the backend
/// keeps text (`compress` false).
pub fn keep(doc: &Instance, compress: bool) -> V {
    let json = serde_json::to_vec(doc).unwrap_or_default();
    if !compress {
        return V::Text(String::from_utf8(json).unwrap_or_default());
    }
    let mut out = vec![ZSTD_DICTIONARY_1];
    match COMPRESSOR.with_borrow_mut(|c| c.as_mut().map_err(|e| std::io::Error::other(e.to_string()))?.compress(&json))
    {
        Ok(z) => {
            out.extend(z);
            V::Blob(out)
        }
        // (zstd refuses nothing it is given; were it to, the text stands.)
        Err(_) => V::Text(String::from_utf8(json).unwrap_or_default()),
    }
}

/// A kept document read back, its context made whole (`None`: not a
/// document this build knows how to read).
pub fn read(v: &V) -> Option<Instance> {
    let mut doc: Instance = match v {
        V::Text(s) => serde_json::from_str(s).ok()?,
        V::Blob(b) if b.first() == Some(&ZSTD_DICTIONARY_1) => {
            let json = DECOMPRESSOR.with_borrow_mut(|d| d.as_mut().ok()?.decompress(&b[1..], MAX_JSON).ok())?;
            serde_json::from_slice(&json).ok()?
        }
        _ => return None,
    };
    super::rows::compose(&mut doc);
    Some(doc)
}
