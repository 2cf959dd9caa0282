#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

// A configuration file, read the two ways it is read: whole by the servers
// (`nodekernel_cluster::Config`, the file of `nk meta`, `nk store` and
// `nk up`), and its `[client]` and `[security]` sections by clients
// (`nodekernel_client::settings`). Any text is refused with an error or
// becomes the settings each role starts with; nothing panics.
fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let origin = Path::new("fuzz.toml");
    if let Ok(c) = nodekernel_cluster::Config::parse(text, origin) {
        let _ = c.meta_config();
        let _ = c.check_meta_dir();
        let _ = c.check_up_dir();
        for (i, s) in c.up_stores().iter().enumerate() {
            let _ = c.store_config_under(i, s, Vec::new(), Path::new("up"));
        }
        let _ = c.client_config();
    }
    if let Ok((client, security)) = nodekernel_client::settings::parse_sections(text, origin) {
        let _ = client.to_config();
        let _ = security.token();
    }
});
