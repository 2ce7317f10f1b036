//! Property test of the GGUF reader: random and mutated headers never panic,
//! and parsing never allocates more than a fixed multiple of the input's
//! size. A counting global allocator measures the peak of every parse, which
//! is why this file holds a single test (tests in one binary share it).

use gguf::read::GgufReader;
use gguf::write::{GgufWriter, TensorType, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            grew(new_size - layout.size());
        } else {
            CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Mutated inputs per run: fixed, so the test's cost and coverage are too.
const ITERATIONS: u64 = 20_000;

/// Most bytes a parse may allocate per input byte (a one-byte array element
/// becomes a whole `GgufValue`), plus a fixed allowance.
const BYTES_PER_INPUT_BYTE: usize = 64;
const FIXED_ALLOWANCE: usize = 1 << 20;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Well-formed files to mutate: every value type the writer emits, quantised
/// and f32 tensors, and arrays of strings (the tokenizer's shape).
fn seeds() -> Vec<Vec<u8>> {
    let mut a = GgufWriter::new();
    a.kv("general.architecture", Value::Str("qwen3moe".into()))
        .kv("qwen3moe.expert_count", Value::U32(4))
        .kv("x.i32", Value::I32(-3))
        .kv("x.f32", Value::F32(0.5))
        .kv("x.bool", Value::Bool(true))
        .kv(
            "tokenizer.ggml.tokens",
            Value::StrArray(vec!["a".into(), "bc".into(), "d".into()]),
        )
        .kv("x.f32s", Value::F32Array(vec![1.0, 2.5]))
        .kv("x.i32s", Value::I32Array(vec![7, -7]));
    a.tensor_f32("a", &[3], &[1.0, 2.0, 3.0]);
    a.tensor(
        "blk.0.ffn_up_exps.weight",
        &[32, 2, 4],
        TensorType::Q8_0,
        vec![1; 8 * 34],
    );
    a.tensor_f32("b", &[2, 1], &[4.0, 5.0]);
    let mut b = GgufWriter::new();
    b.kv("general.type", Value::Str("imatrix".into()));
    b.tensor_f32("t.in_sum2", &[4, 2], &[1.0; 8]);
    b.tensor_f32("t.counts", &[1, 2], &[3.0; 2]);
    vec![a.to_bytes(), b.to_bytes(), GgufWriter::new().to_bytes()]
}

/// Values that make lengths, counts, offsets and dims interesting.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    3,
    4,
    31,
    32,
    255,
    1 << 31,
    1 << 32,
    1 << 62,
    u64::MAX,
];

fn mutate(rng: &mut XorShift, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut f = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(f.len());
        match rng.below(6) {
            0 => f[at] ^= 1 << rng.below(8),
            1 => f[at] = rng.next() as u8,
            2 => {
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let n = if rng.below(2) == 0 { 8 } else { 4 };
                for (i, b) in v.iter().take(n).enumerate() {
                    if let Some(x) = f.get_mut(at + i) {
                        *x = *b;
                    }
                }
            }
            3 => f.truncate(at),
            4 => {
                let piece: Vec<u8> = f[at..f.len().min(at + 1 + rng.below(32))].to_vec();
                let to = rng.below(f.len());
                f.splice(to..to, piece);
            }
            _ => {
                f.truncate(8 + rng.below(64));
                f.extend((0..rng.below(256)).map(|_| rng.next() as u8));
            }
        }
        if f.is_empty() {
            break;
        }
    }
    f
}

#[test]
fn random_and_mutated_headers_never_panic_or_over_allocate() {
    let seeds = seeds();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut worst_ratio) = (0u64, 0f64);
    let start = std::time::Instant::now();
    for i in 0..ITERATIONS {
        let input = mutate(&mut rng, &seeds);
        let base = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let outcome = std::panic::catch_unwind(|| {
            let Ok(mut r) = GgufReader::new(std::io::Cursor::new(input.as_slice()), "<fuzz>")
            else {
                return false;
            };
            let names: Vec<String> = r.header.tensors.iter().map(|t| t.name.clone()).collect();
            for name in names {
                r.tensor_bytes(&name)
                    .expect("a tensor the header accepted can be read");
            }
            true
        });
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let head: Vec<u8> = input.iter().take(96).copied().collect();
        let ok =
            outcome.unwrap_or_else(|_| panic!("iteration {i}: the reader panicked on {head:02x?}"));
        accepted += ok as u64;
        assert!(
            peak <= BYTES_PER_INPUT_BYTE * input.len() + FIXED_ALLOWANCE,
            "iteration {i}: parsing {} bytes allocated {peak} bytes ({head:02x?})",
            input.len()
        );
        worst_ratio = worst_ratio.max(peak as f64 / input.len().max(1) as f64);
    }
    println!(
        "gguf_read fuzz: {ITERATIONS} inputs in {:.2} s, {accepted} accepted, worst peak {worst_ratio:.1} bytes allocated per input byte",
        start.elapsed().as_secs_f64()
    );
    assert!(
        accepted > 0 && accepted < ITERATIONS,
        "mutations both keep and break files"
    );
}
