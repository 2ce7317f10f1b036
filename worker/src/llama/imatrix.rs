//! llama.cpp's own importance-matrix loader (`common_imatrix_load`, what
//! `llama-quantize --imatrix` reads a file with), through the small C
//! interface in `cpp/imatrix_loader.cpp`.

use super::{init_backend, LlamaError};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;

extern "C" {
    fn moe_census_imatrix_load(path: *const c_char) -> *mut c_void;
    fn moe_census_imatrix_free(handle: *mut c_void);
    fn moe_census_imatrix_n_entries(handle: *const c_void) -> usize;
    fn moe_census_imatrix_chunk_count(handle: *const c_void) -> i32;
    fn moe_census_imatrix_chunk_size(handle: *const c_void) -> i32;
    fn moe_census_imatrix_n_datasets(handle: *const c_void) -> usize;
    fn moe_census_imatrix_dataset(handle: *const c_void, i: usize) -> *const c_char;
    fn moe_census_imatrix_entry(
        handle: *const c_void,
        i: usize,
        name: *mut *const c_char,
        sums: *mut *const f32,
        n_sums: *mut usize,
        activations: *mut *const f32,
        n_activations: *mut usize,
        counts: *mut *const i64,
        n_counts: *mut usize,
    );
}

/// One tensor's entry as llama.cpp's loader returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedEntry {
    /// `<tensor>.in_sum2`, `[n_mat][n_in]`.
    pub sums: Vec<f32>,
    /// `<tensor>.in_sum` when the file has it with as many values (else empty).
    pub activations: Vec<f32>,
    /// `<tensor>.counts`, rounded to integers.
    pub counts: Vec<i64>,
}

/// An importance matrix as llama.cpp loads it.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedImatrix {
    /// Per weight tensor name.
    pub entries: BTreeMap<String, LoadedEntry>,
    /// `imatrix.chunk_count`.
    pub chunk_count: i32,
    /// `imatrix.chunk_size`.
    pub chunk_size: i32,
    /// `imatrix.datasets`.
    pub datasets: Vec<String>,
}

/// Copies `n` values from a pointer the loader owns (null when `n` is 0).
///
/// # Safety
/// `ptr` points to `n` initialised values while the handle lives.
unsafe fn copied<T: Copy>(ptr: *const T, n: usize) -> Vec<T> {
    if n == 0 || ptr.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec()
}

/// Reads `path` with llama.cpp's loader; `Err` names the file when the loader
/// refuses it (missing tensors, mismatched sums and counts, not a GGUF).
pub fn load_imatrix(path: &Path) -> Result<LoadedImatrix, LlamaError> {
    init_backend();
    let refused = || LlamaError::Imatrix {
        path: path.display().to_string(),
    };
    let c_path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| refused())?;
    // SAFETY: a valid C string; the shim catches every C++ exception and
    // returns null on failure.
    let handle = unsafe { moe_census_imatrix_load(c_path.as_ptr()) };
    if handle.is_null() {
        return Err(refused());
    }
    // SAFETY: `handle` is a live loader result until the free below; every
    // pointer it hands out stays valid until then, and is copied first.
    let loaded = unsafe {
        let mut entries = BTreeMap::new();
        for i in 0..moe_census_imatrix_n_entries(handle) {
            let (mut name, mut sums, mut acts, mut counts) = (
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
            );
            let (mut n_sums, mut n_acts, mut n_counts) = (0, 0, 0);
            moe_census_imatrix_entry(
                handle,
                i,
                &mut name,
                &mut sums,
                &mut n_sums,
                &mut acts,
                &mut n_acts,
                &mut counts,
                &mut n_counts,
            );
            entries.insert(
                CStr::from_ptr(name).to_string_lossy().into_owned(),
                LoadedEntry {
                    sums: copied(sums, n_sums),
                    activations: copied(acts, n_acts),
                    counts: copied(counts, n_counts),
                },
            );
        }
        let datasets = (0..moe_census_imatrix_n_datasets(handle))
            .map(|i| {
                CStr::from_ptr(moe_census_imatrix_dataset(handle, i))
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let out = LoadedImatrix {
            entries,
            chunk_count: moe_census_imatrix_chunk_count(handle),
            chunk_size: moe_census_imatrix_chunk_size(handle),
            datasets,
        };
        moe_census_imatrix_free(handle);
        out
    };
    Ok(loaded)
}
