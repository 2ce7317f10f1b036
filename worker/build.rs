//! Compiles the C interface to llama.cpp's importance-matrix loader
//! (`src/llama/cpp/imatrix_loader.cpp`) against the headers of the
//! llama.cpp that `llama-cpp-sys-2` built, whose `common` library holds the
//! loader itself.

use std::path::PathBuf;

fn main() {
    let shim = "src/llama/cpp/imatrix_loader.cpp";
    println!("cargo:rerun-if-changed={shim}");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_ROOT");
    let root = PathBuf::from(
        std::env::var_os("DEP_LLAMA_ROOT")
            .expect("llama-cpp-sys-2 sets DEP_LLAMA_ROOT for its direct dependents"),
    );
    // llama-cpp-sys-2 builds llama.cpp with CMake; its cache names the source.
    let cache = root.join("build").join("CMakeCache.txt");
    let text = std::fs::read_to_string(&cache)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", cache.display()));
    let source = text
        .lines()
        .find_map(|l| l.strip_prefix("llama.cpp_SOURCE_DIR:STATIC="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{} names no llama.cpp_SOURCE_DIR", cache.display()));
    let common = source.join("common");
    assert!(
        common.join("imatrix-loader.h").is_file(),
        "no imatrix-loader.h under {}",
        common.display()
    );
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file(shim)
        .include(&common)
        .include(source.join("include"))
        .include(source.join("ggml").join("include"))
        .warnings(true)
        .compile("moe_census_imatrix_loader");
}
