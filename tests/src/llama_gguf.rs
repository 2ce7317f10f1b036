//! GGUF files read through llama.cpp's own `gguf_*` reader: an oracle for the
//! files this project writes, independent of its Rust writer.

use llama_cpp_sys_2 as sys;
use std::ffi::{CStr, CString};
use std::path::Path;

/// A GGUF file loaded (with tensor data) by llama.cpp.
pub struct LlamaGguf {
    gguf: *mut sys::gguf_context,
    ctx: *mut sys::ggml_context,
}

/// One f32 tensor: ggml `ne` and values.
pub struct F32Tensor {
    /// Elements per dimension, fastest-varying first.
    pub ne: [usize; 4],
    /// Values in memory order.
    pub data: Vec<f32>,
}

impl LlamaGguf {
    /// Opens and fully loads a GGUF file; `Err` if llama.cpp rejects it.
    pub fn open(path: &Path) -> Result<LlamaGguf, String> {
        let c = CString::new(path.to_str().unwrap()).unwrap();
        let mut ctx: *mut sys::ggml_context = std::ptr::null_mut();
        let params = sys::gguf_init_params {
            no_alloc: false,
            ctx: &mut ctx,
        };
        // SAFETY: valid C string; llama.cpp writes the ggml context pointer.
        let gguf = unsafe { sys::gguf_init_from_file(c.as_ptr(), params) };
        if gguf.is_null() || ctx.is_null() {
            return Err(format!(
                "llama.cpp's GGUF reader rejected {}",
                path.display()
            ));
        }
        Ok(LlamaGguf { gguf, ctx })
    }

    fn key(&self, key: &str) -> Option<i64> {
        let c = CString::new(key).unwrap();
        // SAFETY: live context, valid C string.
        let id = unsafe { sys::gguf_find_key(self.gguf, c.as_ptr()) };
        (id >= 0).then_some(id)
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Option<String> {
        let id = self.key(key)?;
        // SAFETY: key exists; llama.cpp asserts the type and returns a C string.
        unsafe {
            (sys::gguf_get_kv_type(self.gguf, id) == sys::GGUF_TYPE_STRING).then(|| {
                CStr::from_ptr(sys::gguf_get_val_str(self.gguf, id))
                    .to_string_lossy()
                    .into_owned()
            })
        }
    }

    /// A u32 value.
    pub fn u32(&self, key: &str) -> Option<u32> {
        let id = self.key(key)?;
        // SAFETY: key exists and its type is checked first.
        unsafe {
            (sys::gguf_get_kv_type(self.gguf, id) == sys::GGUF_TYPE_UINT32)
                .then(|| sys::gguf_get_val_u32(self.gguf, id))
        }
    }

    /// An f32 value.
    pub fn f32(&self, key: &str) -> Option<f32> {
        let id = self.key(key)?;
        // SAFETY: key exists and its type is checked first.
        unsafe {
            (sys::gguf_get_kv_type(self.gguf, id) == sys::GGUF_TYPE_FLOAT32)
                .then(|| sys::gguf_get_val_f32(self.gguf, id))
        }
    }

    /// A bool value.
    pub fn bool(&self, key: &str) -> Option<bool> {
        let id = self.key(key)?;
        // SAFETY: key exists and its type is checked first.
        unsafe {
            (sys::gguf_get_kv_type(self.gguf, id) == sys::GGUF_TYPE_BOOL)
                .then(|| sys::gguf_get_val_bool(self.gguf, id))
        }
    }

    /// A string array value.
    pub fn str_array(&self, key: &str) -> Option<Vec<String>> {
        let id = self.key(key)?;
        // SAFETY: key exists, types checked, indices below the array length.
        unsafe {
            if sys::gguf_get_kv_type(self.gguf, id) != sys::GGUF_TYPE_ARRAY
                || sys::gguf_get_arr_type(self.gguf, id) != sys::GGUF_TYPE_STRING
            {
                return None;
            }
            Some(
                (0..sys::gguf_get_arr_n(self.gguf, id))
                    .map(|i| {
                        CStr::from_ptr(sys::gguf_get_arr_str(self.gguf, id, i))
                            .to_string_lossy()
                            .into_owned()
                    })
                    .collect(),
            )
        }
    }

    /// Names of all tensors, in file order.
    pub fn tensor_names(&self) -> Vec<String> {
        // SAFETY: indices below gguf_get_n_tensors.
        unsafe {
            (0..sys::gguf_get_n_tensors(self.gguf))
                .map(|i| {
                    CStr::from_ptr(sys::gguf_get_tensor_name(self.gguf, i))
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        }
    }

    /// An f32 tensor by name (`None` if absent or not f32).
    pub fn f32_tensor(&self, name: &str) -> Option<F32Tensor> {
        let c = CString::new(name).unwrap();
        // SAFETY: the ggml context holds the loaded tensors; data is ne-product f32s.
        unsafe {
            let t = sys::ggml_get_tensor(self.ctx, c.as_ptr()).as_ref()?;
            if t.type_ != sys::GGML_TYPE_F32 {
                return None;
            }
            let ne = t.ne.map(|n| n as usize);
            let n: usize = ne.iter().product();
            let data = std::slice::from_raw_parts(sys::ggml_get_data_f32(t), n).to_vec();
            Some(F32Tensor { ne, data })
        }
    }
}

impl LlamaGguf {
    /// A tensor of any ggml type by name, converted to f32 by ggml's own
    /// `to_float` for its type (`None` if absent or not convertible).
    pub fn tensor_as_f32(&self, name: &str) -> Option<F32Tensor> {
        let c = CString::new(name).unwrap();
        // SAFETY: the ggml context holds the loaded tensor; ggml_nbytes bytes
        // of data are present and to_float writes exactly nelements floats.
        unsafe {
            let t = sys::ggml_get_tensor(self.ctx, c.as_ptr()).as_ref()?;
            let ne = t.ne.map(|n| n as usize);
            let n: usize = ne.iter().product();
            let mut data = vec![0f32; n];
            if t.type_ == sys::GGML_TYPE_F32 {
                data.copy_from_slice(std::slice::from_raw_parts(sys::ggml_get_data_f32(t), n));
            } else {
                let to_float = (*sys::ggml_get_type_traits(t.type_)).to_float?;
                to_float(t.data, data.as_mut_ptr(), n as i64);
            }
            Some(F32Tensor { ne, data })
        }
    }

    /// The ggml type id of a tensor.
    pub fn tensor_type(&self, name: &str) -> Option<u32> {
        let c = CString::new(name).unwrap();
        // SAFETY: live context, valid C string.
        unsafe {
            sys::ggml_get_tensor(self.ctx, c.as_ptr())
                .as_ref()
                .map(|t| t.type_)
        }
    }

    /// Absolute file offset and size of a tensor's data, as llama.cpp's
    /// reader places it.
    pub fn tensor_range(&self, name: &str) -> Option<(u64, u64)> {
        let c = CString::new(name).unwrap();
        // SAFETY: live context; the tensor id is checked before use.
        unsafe {
            let id = sys::gguf_find_tensor(self.gguf, c.as_ptr());
            if id < 0 {
                return None;
            }
            let start =
                sys::gguf_get_data_offset(self.gguf) + sys::gguf_get_tensor_offset(self.gguf, id);
            Some((
                start as u64,
                sys::gguf_get_tensor_size(self.gguf, id) as u64,
            ))
        }
    }
}

impl Drop for LlamaGguf {
    fn drop(&mut self) {
        // SAFETY: both were created in `open` and are freed once.
        unsafe {
            sys::gguf_free(self.gguf);
            sys::ggml_free(self.ctx);
        }
    }
}
