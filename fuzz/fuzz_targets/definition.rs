//! The definition loader: any text loads or is refused with located errors.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(errs) = apollo_shared::def::parse(text, "tasks/fuzz.yaml") {
            assert!(!errs.0.is_empty());
        }
    }
});
