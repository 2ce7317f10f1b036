//! Where the collector reduces observed tensors: `--reduce auto|host|device`.

use crate::error::WorkerError;
use std::fmt;

/// Environment variable read when `--reduce` is not given (tests and
/// launchers set it to run every worker on one path).
pub use runfiles::layout::env::REDUCE as REDUCE_ENV;

/// Where observed tensors are reduced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reduce {
    /// `device` when model layers are offloaded to a GPU (copies would bound
    /// the run there), `host` otherwise (on the CPU the host reads tensors
    /// in place, and the device path's one-hot matmuls are extra work).
    #[default]
    Auto,
    /// Copy (or read in place) every observed tensor and reduce on the host
    /// in f64: the reference path.
    Host,
    /// Reduce on the tensor's own backend and copy only the results.
    Device,
}

impl Reduce {
    /// Every place, in the flag's order.
    pub const ALL: [Reduce; 3] = [Reduce::Auto, Reduce::Host, Reduce::Device];

    /// The place named `s` (`auto`, `host` or `device`, in any case).
    pub fn parse(s: &str) -> Option<Reduce> {
        Reduce::ALL
            .into_iter()
            .find(|r| r.to_string().eq_ignore_ascii_case(s))
    }

    /// The flag's value, or `MOE_CENSUS_REDUCE`'s when the flag is absent,
    /// or `auto`; an unknown value in the variable is an error naming it.
    pub fn from_flag_or_env(flag: Option<Reduce>) -> Result<Reduce, WorkerError> {
        if let Some(r) = flag {
            return Ok(r);
        }
        match std::env::var(REDUCE_ENV) {
            Ok(v) => Reduce::parse(v.trim()).ok_or(WorkerError::EnvValue {
                var: REDUCE_ENV,
                value: v,
                expected: "auto, host or device",
            }),
            Err(std::env::VarError::NotPresent) => Ok(Reduce::Auto),
            Err(error) => Err(WorkerError::EnvUnreadable {
                var: REDUCE_ENV,
                error,
            }),
        }
    }

    /// Whether to reduce on the device, given the layers offloaded and
    /// whether this build has a GPU backend.
    pub fn on_device(self, n_gpu_layers: u32, has_gpu: bool) -> bool {
        match self {
            Reduce::Auto => n_gpu_layers > 0 && has_gpu,
            Reduce::Host => false,
            Reduce::Device => true,
        }
    }
}

impl fmt::Display for Reduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reduce::Auto => "auto",
            Reduce::Host => "host",
            Reduce::Device => "device",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Reduce;

    #[test]
    fn auto_reduces_on_the_device_only_with_offloaded_layers_on_a_gpu() {
        assert!(Reduce::Auto.on_device(99, true));
        assert!(!Reduce::Auto.on_device(0, true));
        assert!(!Reduce::Auto.on_device(99, false));
        assert!(Reduce::Device.on_device(0, false));
        assert!(!Reduce::Host.on_device(99, true));
    }

    /// `MOE_CENSUS_REDUCE` reads the flag's names in any case, and no other.
    #[test]
    fn names_parse_in_any_case() {
        assert_eq!(Reduce::parse("device"), Some(Reduce::Device));
        assert_eq!(Reduce::parse("HOST"), Some(Reduce::Host));
        assert_eq!(Reduce::parse("Auto"), Some(Reduce::Auto));
        assert_eq!(Reduce::parse("gpu"), None);
        assert_eq!(Reduce::parse(""), None);
    }
}
