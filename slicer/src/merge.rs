//! Merged experts: each centre of a merge plan written as the weighted mean
//! of its members' rows. F32 is read and written here; every other type is
//! decoded and re-encoded by a [`RowCodec`] the caller supplies (ggml's own
//! type traits, in the worker: this crate may not link llama.cpp, and a
//! hand-written quantiser would drift from ggml's).

use super::plan::{Cut, Plan};
use super::PruneError;
use gguf::read::GgufHeader;

/// ggml's type id of 32-bit floats.
pub(super) const GGML_F32: u32 = 0;

/// Decodes and encodes ggml tensor data, as ggml's type traits do
/// (`to_float`, `from_float`). Only asked about types other than F32.
pub trait RowCodec {
    /// `Ok` when values of ggml type `ty` can be decoded and re-encoded;
    /// otherwise why not (a type that needs an importance matrix to
    /// quantise, one ggml does not know).
    fn check(&self, ty: u32) -> Result<(), String>;
    /// Decodes `out.len()` values of type `ty` from `bytes` (exactly their
    /// encoded size, whole blocks).
    fn decode(&self, ty: u32, bytes: &[u8], out: &mut [f32]);
    /// Encodes `values` (whole blocks) as type `ty` into `out` (exactly
    /// their encoded size).
    fn encode(&self, ty: u32, values: &[f32], out: &mut [u8]);
}

/// The codec a binary that links ggml installed ([`install_codec`]).
static INSTALLED: std::sync::OnceLock<&'static (dyn RowCodec + Sync)> = std::sync::OnceLock::new();

/// Makes `codec` the one [`installed_codec`] returns, for the stages that
/// merge experts but may not link llama.cpp themselves (the coordinator
/// installs ggml's at start); a second call changes nothing.
pub fn install_codec(codec: &'static (dyn RowCodec + Sync)) {
    let _ = INSTALLED.set(codec);
}

/// The codec [`install_codec`] installed, if any.
pub fn installed_codec() -> Option<&'static dyn RowCodec> {
    INSTALLED.get().map(|c| *c as &dyn RowCodec)
}

/// Checks, before anything is written, that every tensor the plan merges
/// (a group that is not one expert of weight 1) is F32 or of a type
/// `codec` can decode and re-encode.
pub(super) fn check_codec(
    header: &GgufHeader,
    plan: &Plan,
    codec: Option<&dyn RowCodec>,
    path: &str,
) -> Result<(), PruneError> {
    for (t, cut) in header.tensors.iter().zip(&plan.cuts) {
        let Cut::Merged(groups) = cut else { continue };
        let averages = groups
            .iter()
            .any(|g| !matches!(g[..], [(_, w)] if w == 1.0));
        if !averages || t.ggml_type == GGML_F32 {
            continue;
        }
        let name = gguf::quant::ggml_type_name(t.ggml_type);
        let refused = match codec {
            None => Err(format!(
                "merging experts of type {name} needs ggml's type traits to re-quantise (a codec); only F32 merges without one"
            )),
            Some(codec) => codec
                .check(t.ggml_type)
                .map_err(|why| format!("its experts ({name}) cannot be merged: {why}")),
        };
        refused.map_err(|reason| PruneError::Tensor {
            path: path.to_string(),
            tensor: t.name.clone(),
            reason,
        })?;
    }
    Ok(())
}

/// One merged expert: `Σ wᵢ · xᵢ` over `members` (ids and weights, in
/// order), accumulated in f64 per element in member order and rounded to
/// f32 once; `read(id, buf)` fills `buf` with member `id`'s encoded bytes.
/// Returns the result encoded as `ty` in `out`. Memory: one expert's
/// values in f64 and f32 and its bytes twice.
pub(super) struct Mean<'c> {
    ty: u32,
    codec: Option<&'c dyn RowCodec>,
    acc: Vec<f64>,
    values: Vec<f32>,
    bytes: Vec<u8>,
}

impl<'c> Mean<'c> {
    /// Buffers for experts of `n` values of type `ty` in `n_bytes` bytes.
    pub fn new(ty: u32, codec: Option<&'c dyn RowCodec>, n: usize, n_bytes: usize) -> Mean<'c> {
        Mean {
            ty,
            codec,
            acc: vec![0.0; n],
            values: vec![0.0; n],
            bytes: vec![0; n_bytes],
        }
    }

    /// The weighted mean of `members`, encoded into `out`.
    pub fn of<E>(
        &mut self,
        members: &[(u32, f64)],
        mut read: impl FnMut(u32, &mut [u8]) -> Result<(), E>,
        out: &mut Vec<u8>,
    ) -> Result<(), E> {
        self.acc.iter_mut().for_each(|a| *a = 0.0);
        for &(id, w) in members {
            read(id, &mut self.bytes)?;
            self.decode();
            for (a, &v) in self.acc.iter_mut().zip(&self.values) {
                *a += w * f64::from(v);
            }
        }
        for (v, &a) in self.values.iter_mut().zip(&self.acc) {
            *v = a as f32;
        }
        out.clear();
        out.resize(self.bytes.len(), 0);
        match (self.ty, self.codec) {
            (GGML_F32, _) => {
                for (o, v) in out.chunks_exact_mut(4).zip(&self.values) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            (ty, Some(codec)) => codec.encode(ty, &self.values, out),
            (_, None) => unreachable!("checked before writing"),
        }
        Ok(())
    }

    fn decode(&mut self) {
        match (self.ty, self.codec) {
            (GGML_F32, _) => {
                for (v, b) in self.values.iter_mut().zip(self.bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                }
            }
            (ty, Some(codec)) => codec.decode(ty, &self.bytes, &mut self.values),
            (_, None) => unreachable!("checked before writing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_means_are_weighted_sums_rounded_once() {
        let experts: [[f32; 3]; 3] = [[1.0, -2.0, 0.5], [3.0, 4.0, 0.5], [1e8, 1.0, 0.5]];
        let mut m = Mean::new(GGML_F32, None, 3, 12);
        let mut out = Vec::new();
        let members = [(2, 0.5), (0, 0.25), (1, 0.25)];
        m.of::<()>(
            &members,
            |id, buf| {
                for (b, v) in buf.chunks_exact_mut(4).zip(&experts[id as usize]) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
                Ok(())
            },
            &mut out,
        )
        .unwrap();
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        // 5e7 + 0.25 + 0.75 is 50,000,001, whose nearest f32 is 5e7.
        assert_eq!(got, [50_000_000.0, 1.0, 0.5]);
    }
}
