//! Fuzzes `dory convert-config` (an operator's XML file, possibly a broken one): it must
//! never panic, and whatever it converts must load as a dory config.
#![no_main]

use std::path::Path;

use dory::config::convert::convert;
use dory::config::{parse_toml, Config, Overrides};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(xml) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = convert(xml, "fuzz.xml") {
        let raw = parse_toml(Path::new("fuzz.toml"), &c.toml).expect("converted TOML parses");
        Config::from_parts(raw, true, &Overrides::default()).expect("converted TOML loads");
    }
});
