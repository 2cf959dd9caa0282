//! Every `native` method the Java client declares (`Native.java`) is
//! exported by the library under its JNI name, so a method added or
//! renamed on one side only fails here, not as an `UnsatisfiedLinkError`
//! in a user's JVM. It also makes `cargo test --workspace` build the
//! library with the test build's features, which `scripts/test.sh` hands
//! to the Java tests instead of building it again.

use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The library `cargo test` built beside this test's executable
/// (`target/<profile>/deps/`; `cargo test` does not copy it up a level).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps");
    dir.join("deps/libnodekernel_jni.so")
}

/// The names of the `static native` methods declared in `Native.java`.
fn declared() -> Vec<String> {
    let java = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../java/nodekernel-client/src/main/java/io/nodekernel/Native.java");
    let src = std::fs::read_to_string(&java).expect("Native.java");
    src.split("static native ")
        .skip(1)
        .map(|decl| {
            let head = decl.split('(').next().expect("a declaration");
            let name = head.split_whitespace().last().expect("a method name");
            name.to_string()
        })
        .collect()
}

#[test]
fn every_native_method_of_the_java_client_is_exported() {
    let names = declared();
    assert!(
        names.len() >= 30,
        "Native.java declares only {names:?}: its format changed, fix this parser"
    );
    let lib = library();
    let path = CString::new(lib.to_str().expect("a UTF-8 path")).unwrap();
    // SAFETY: loading the library runs no code of ours (no constructors);
    // it stays loaded until the process exits.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "cannot load {}", lib.display());
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| {
            // Method names without underscores map to `Java_<class>_<name>`
            // (an underscore would be escaped as `_1`).
            assert!(!name.contains('_'), "{name}: JNI escaping not handled");
            let symbol = CString::new(format!("Java_io_nodekernel_Native_{name}")).unwrap();
            // SAFETY: `handle` is a library loaded above; dlsym only looks up.
            unsafe { libc::dlsym(handle, symbol.as_ptr()) }.is_null()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "declared in Native.java but not exported by {}: {missing:?}",
        lib.display()
    );
}
