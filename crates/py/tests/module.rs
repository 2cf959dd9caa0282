//! The native module that `cargo test` builds is a Python extension
//! module: it exports the init function CPython looks for, and does not
//! link libpython. `scripts/test.sh` installs this build into `.venv`
//! (scripts/python-env.sh) instead of compiling the binding again.

use std::path::PathBuf;

/// The module `cargo test` built beside this test's executable.
fn module() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .expect("the test runs from target/<profile>/deps")
        .join("lib_native.so")
}

#[test]
fn the_built_module_is_a_python_extension_module() {
    let path = module();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let has = |s: &[u8]| bytes.windows(s.len()).any(|w| w == s);
    assert!(
        has(b"PyInit__native\0"),
        "{} exports no PyInit__native",
        path.display()
    );
    // A module that names libpython in its dynamic section loads a second
    // interpreter library into statically linked Pythons.
    assert!(!has(b"libpython3"), "{} links libpython", path.display());
}
